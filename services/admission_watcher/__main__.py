from taugrid.service import Service, main
from taugrid_services.admission_watcher.handlers import AdmissionWatcher


async def start(svc: Service) -> None:
    svc.consume("admission-watcher", AdmissionWatcher(svc.bus).on_event)


if __name__ == "__main__":
    main("admission-watcher", start)
