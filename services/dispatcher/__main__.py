from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.platformread import PlatformReader
from taugrid.bus.sites import DISPATCHER_DURABLE, hub_stream
from taugrid.config.platform import Platform
from taugrid.core.errors import TemporaryError
from taugrid.core.siteleases import renew_period
from taugrid.service import Service, main
from taugrid_services.dispatcher.handlers import Dispatcher

ROUND_TICK_S = 5.0


async def start(svc: Service) -> None:
    reader = PlatformReader(svc.bus)

    async def platform() -> Platform:
        got = await reader.get()
        if got is None:
            raise TemporaryError("no platform applied yet")
        return got[0]

    dispatcher = Dispatcher(svc.bus, platform)
    svc.consume("dispatcher", dispatcher.on_request)
    # one loop per cluster the platform names now; the cluster is the stream's, never what a report says
    for cluster in (await platform()).clusters:
        loop = ConsumerLoop(svc.bus, stream=hub_stream(cluster.name), durable=DISPATCHER_DURABLE,
                            handler=dispatcher.reports_of(cluster.name))
        svc.loops.append(loop)
    svc.every(ROUND_TICK_S, dispatcher.next_rounds)
    # the sites' leases are judged as often as they are renewed (read at start: a change needs a restart)
    svc.every(renew_period((await platform()).dispatch.worker_lost_timeout), dispatcher.leases_pass)


if __name__ == "__main__":
    main("dispatcher", start)
