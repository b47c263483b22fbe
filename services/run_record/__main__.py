from taugrid.service import Service, main
from taugrid_services.run_record.handlers import Recorder


async def start(svc: Service) -> None:
    r = Recorder(svc.bus)
    # the Projector keeps each run's order; a run's lingering events stay in flight meanwhile (projection.LINGER)
    svc.consume("runstate", r.on_event, batch=Recorder.BATCH, ordered=Recorder.ORDERED)


if __name__ == "__main__":
    main("run_record", start)
