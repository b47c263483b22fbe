"""local-cluster: the embedded backend. Admits workloads by ClusterQueue quota and priority, runs each pod as
a real OS process under a shim, streams logs, and publishes Kubernetes-shaped watch events on ``k8s.local.*``.

Owns: ``backend.local.apply`` / ``backend.local.delete`` → ``k8s.local.<kind>.<ns>.<name>.<change>``, ``log.*``.
It is a singleton per machine (it owns the machine's resources); its state lives in the ``local_cluster`` KV
bucket and pod directories, so a restart re-adopts running pods instead of losing them.
"""
