from taugrid.service import Service, main
from taugrid_services.submitter.handlers import Submitter


async def start(svc: Service) -> None:
    s = Submitter(svc.bus)
    svc.consume("submitter", s.on_requested)


if __name__ == "__main__":
    main("submitter", start)
