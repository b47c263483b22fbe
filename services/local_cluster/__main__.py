from taugrid import settings
from taugrid.bus import sites
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.local import runas
from taugrid.local.controller import LocalCluster
from taugrid.local.machine import inventory
from taugrid.service import Service, main


async def start(svc: Service) -> None:
    node, capacity, gpus, gpu_mem = inventory(svc.settings.local)
    data = settings.data_dir()
    cluster = LocalCluster(svc.bus, data_dir=data, node=node, capacity=capacity, gpu_count=gpus,
                           gpu_memory_mb=gpu_mem,
                           drain_grace_s=float(svc.settings.health.drain_grace_s),
                           run_as=runas.from_env(data),  # each workspace's OS user when the stack is root
                           given=svc.settings)
    await cluster.load()
    if cluster.site:
        # a site's requests are the dispatcher's, sourced from the hub into its own SITE_IN (docs §13d); its
        # nodes' cordons have no stream here yet (§16)
        svc.loops.append(ConsumerLoop(svc.bus, stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE,
                                      handler=cluster.on_backend))
    else:
        svc.consume("local-cluster", cluster.on_backend)
        svc.consume("local-cluster-nodes", cluster.on_node)
    svc.background(cluster.admission_loop(svc.stopping))  # cycles on new work or freed capacity
    svc.every(0.2, cluster.housekeep)  # pods to launch and supervise, reasons, the queue snapshot


if __name__ == "__main__":
    main("local-cluster", start)
