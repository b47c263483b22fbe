from taugrid.service import Service, main
from taugrid_services.recovery.handlers import Recovery


async def start(svc: Service) -> None:
    svc.consume("recovery", Recovery(svc.bus, settle_s=svc.settings.health.recovery_settle_s).on_event)


if __name__ == "__main__":
    main("recovery", start)
