"""local-cluster: the embedded backend's service. Wiring only: the controller (``taugrid.local.controller``)
admits workloads by ClusterQueue quota and priority and runs their pods through the local kubelet
(``taugrid.local.kubelet``), publishing Kubernetes-shaped watch events on ``k8s.local.*`` and logs on ``log.*``.

Owns: ``backend.local.apply`` / ``backend.local.delete`` → ``k8s.local.<kind>.<ns>.<name>.<change>``, ``log.*``.
It is a singleton per machine (it owns the machine's resources); its state lives in the ``local_cluster`` KV
bucket and pod directories, so a restart re-adopts running pods instead of losing them.
"""
