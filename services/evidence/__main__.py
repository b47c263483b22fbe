from taugrid.service import Service, main
from taugrid_services.evidence.handlers import Evidence


async def start(svc: Service) -> None:
    svc.consume("evidence", Evidence(svc.bus).on_event)


if __name__ == "__main__":
    main("evidence", start)
