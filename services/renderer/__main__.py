from taugrid import backend
from taugrid.service import Service, main
from taugrid_services.renderer.handlers import Renderer


async def start(svc: Service) -> None:
    svc.consume("renderer", Renderer(svc.bus, await backend.make(svc.bus, svc.settings.process)).on_event)


if __name__ == "__main__":
    main("renderer", start)
