from taugrid.service import Service, main
from taugrid_services.run_record.handlers import Recorder


async def start(svc: Service) -> None:
    r = Recorder(svc.bus)
    svc.consume("runstate", r.on_event, batch=64, ordered=False)  # the Projector keeps each run's order


if __name__ == "__main__":
    main("run_record", start)
