"""kube-bridge: list+watch the Kubernetes objects taugrid cares about and republish every change on
``k8s.<cluster>.<kind>.<namespace>.<name>.<added|modified|deleted>`` (one active bridge per cluster)."""
