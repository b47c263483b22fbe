import os

from taugrid.service import Service, main
from taugrid_services.recovery.handlers import Recovery


async def start(svc: Service) -> None:
    settle_s = float(os.environ.get("TAU_RECOVERY_HEALTH_SETTLE_S", "10"))
    svc.consume("recovery", Recovery(svc.bus, settle_s=settle_s).on_event)


if __name__ == "__main__":
    main("recovery", start)
