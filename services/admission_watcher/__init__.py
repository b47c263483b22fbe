"""admission-watcher: turns Kubernetes-shaped Workload/Job/RayJob/Pod watch events (from kube-bridge or the
local cluster) into run events: queued (with the reason), admitted, preempted, running, succeeded, failed.

Owns: ``k8s.>`` → ``admission.*`` and ``exec.*``.
"""
