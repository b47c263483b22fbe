import logging

from taugrid import settings
from taugrid.bus import sites
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.core.errors import TemporaryError
from taugrid.core.siteleases import WORKER_LOST_TIMEOUT_S, renew_period
from taugrid.local import runas
from taugrid.local.controller import LocalCluster
from taugrid.local.machine import inventory
from taugrid.service import Service, main

log = logging.getLogger("taugrid.local_cluster")


async def start(svc: Service) -> None:
    node, capacity, gpus, gpu_mem, gpu_resource = inventory(svc.settings.local)
    data = settings.data_dir()
    cluster = LocalCluster(svc.bus, data_dir=data, node=node, capacity=capacity, gpu_count=gpus,
                           gpu_memory_mb=gpu_mem, gpu_resource=gpu_resource,
                           drain_grace_s=float(svc.settings.health.drain_grace_s),
                           run_as=runas.from_env(data),  # each workspace's OS user when the stack is root
                           given=svc.settings)
    await cluster.load()
    if cluster.site:
        # a returning site stops its orphans (runs requeued elsewhere while it was away) before anything else
        try:
            await cluster.lease_pass()
        except TemporaryError as exc:  # the hub is out of reach: running work goes on; admission and requests
            log.warning("no lease renewal at start: %s", exc)  # wait for a renewal (``lease_held``)
        # a quarter of the platform's worker_lost_timeout, at most 5 s (read at start: a change needs a restart)
        timeout = cluster.platform.dispatch.worker_lost_timeout if cluster.platform else WORKER_LOST_TIMEOUT_S
        svc.every(renew_period(timeout), cluster.lease_pass)
        # a site's requests are the dispatcher's, sourced from the hub into its own SITE_IN (docs §13d); its
        # nodes' cordons have no stream here yet (§16)
        svc.loops.append(ConsumerLoop(svc.bus, stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE,
                                      handler=cluster.on_backend, gate=cluster.lease_held))
    else:
        svc.consume("local-cluster", cluster.on_backend)
        svc.consume("local-cluster-nodes", cluster.on_node)
    svc.background(cluster.admission_loop(svc.stopping))  # cycles on new work or freed capacity
    svc.every(0.2, cluster.housekeep)  # pods to launch and supervise, reasons, the queue snapshot
    cluster.recycle = svc.recycle  # started afresh once a drained backlog left it swollen (RECYCLE_ABOVE_MB)
    cluster.started()


if __name__ == "__main__":
    main("local-cluster", start)
