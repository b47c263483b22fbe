"""dispatcher: sends each run's copy to the clusters nominated for it, lets the first cluster to admit it win
(written once, compare-and-set) and withdraws the other copies, as Kueue's MultiKueue does (docs §13d).

Owns: ``backend.dispatch.apply|delete`` (the renderer's requests, ``TAU_CLUSTER=dispatch``) and each cluster's
reports on the hub (``SITE_<CLUSTER>``) → ``backend.<cluster>.reserve|apply|delete``, the chosen cluster's
object changes on ``k8s.<cluster>.…``, and ``dispatch.nominated``,
``dispatch.chosen``, ``dispatch.withdrawn`` run events.
"""
