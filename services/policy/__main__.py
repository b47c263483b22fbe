from taugrid.service import Service, main
from taugrid_services.policy.handlers import Policy


async def start(svc: Service) -> None:
    svc.consume("policy", Policy(svc.bus).on_accepted)


if __name__ == "__main__":
    main("policy", start)
