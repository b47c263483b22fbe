from taugrid.bus.service import Service, main
from taugrid_services.submitter.handlers import Submitter


async def start(svc: Service) -> None:
    s = Submitter(svc.bus)
    svc.consume("submitter", s.on_requested)
    svc.consume("runstate", s.on_any, batch=64, ordered=False)  # runstate.Projector keeps each run's order


if __name__ == "__main__":
    main("submitter", start)
