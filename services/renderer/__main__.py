from taugrid.backend import from_env
from taugrid.service import Service, main
from taugrid_services.renderer.handlers import Renderer


async def start(svc: Service) -> None:
    svc.consume("renderer", Renderer(svc.bus, await from_env(svc.bus)).on_event)


if __name__ == "__main__":
    main("renderer", start)
