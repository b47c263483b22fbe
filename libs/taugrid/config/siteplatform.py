"""The platform a site admits by: the control plane's platform with the site's own nominal quotas put in
(``platform.yaml`` ``clusters[].quotas``, ``config.clusters.ClusterQuota``).

Every site receives the whole platform (``stack.sites`` copies it into the site's ``platform`` bucket); its local
cluster, knowing which cluster it is (``TAU_CLUSTER``), admits by ``for_cluster`` of it, so a cluster declared
with 32 CPUs of ``research`` holds 32 there whatever the platform's ``cluster_queues`` say, and a cluster without
quotas holds the platform's in full.

Pure. Invariant: only the nominal quotas named change; every other key (borrowing and lending limits, other
flavors, resources and queues) is the platform's. The quotas were checked with the platform
(``clusters.check_clusters``), so each names a queue, flavor and resource that exist.
"""

from __future__ import annotations

from taugrid.config.platform import Platform


def for_cluster(platform: Platform, cluster: str) -> Platform:
    """``platform`` as ``cluster``'s site admits by it: unchanged (the same object) when the cluster declares no
    quotas or is not one of the platform's."""
    quotas = next((c.quotas for c in platform.clusters if c.name == cluster), [])
    if not quotas:
        return platform
    out = platform.model_copy(deep=True)
    queues = {q.name: q for q in out.cluster_queues}
    for quota in quotas:
        queue = queues.get(quota.cluster_queue)
        for group in queue.resource_groups if queue is not None else []:
            for flavor in group.flavors:
                if flavor.name != quota.flavor:
                    continue
                for resource in flavor.resources:
                    if resource.name in quota.resources:
                        resource.nominal_quota = quota.resources[resource.name]
    return out
