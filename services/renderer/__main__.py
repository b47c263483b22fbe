from taugrid import backend
from taugrid.render import RenderSettings
from taugrid.service import Service, main
from taugrid_services.renderer.handlers import Renderer


async def start(svc: Service) -> None:
    port = await backend.make(svc.bus, svc.settings)
    svc.consume("renderer", Renderer(svc.bus, port, RenderSettings.from_settings(svc.settings.renderer)).on_event)


if __name__ == "__main__":
    main("renderer", start)
