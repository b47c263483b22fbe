"""``python -m taugrid_services.portal``: the web portal (``app.py``) as a service of the bus.

Environment: ``TAU_PORTAL_PORT`` (default 8470), ``TAU_PORTAL_HOST`` (default 127.0.0.1; the chart sets
0.0.0.0). Replicas on one machine share the port (``SO_REUSEPORT``); on Kubernetes a Service spreads requests
over them. The portal signs cancels with its own key on a person's behalf, so it needs its bus credentials' seed
(``TAU_NATS_CREDS``, as every service has).
"""

from __future__ import annotations

import logging

from aiohttp import web

from taugrid.service import Service, main
from taugrid_services.portal.app import build

log = logging.getLogger("taugrid.portal")
DEFAULT_PORT = 8470


async def start(svc: Service) -> None:
    me = svc.bus.identity
    if me is None or not me.seed:
        raise SystemExit("the portal needs its own bus credentials (TAU_NATS_CREDS): it signs cancels with them")
    svc.bus.seed = me.seed.encode()
    host, given_port = svc.settings.portal.host, svc.settings.portal.port
    port = DEFAULT_PORT if given_port is None else given_port
    runner = web.AppRunner(build(svc.bus, portal_key=me.public_key), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=True)
    await site.start()
    log.info("portal listening on http://%s:%d", host, port)

    async def serve() -> None:
        try:
            await svc.stopping.wait()
        finally:
            await runner.cleanup()

    svc.background(serve())


if __name__ == "__main__":
    main("portal", start)
