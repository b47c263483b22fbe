"""``python -m taugrid_services.health_monitor``: consumes ``node.*.sample`` with durable ``health-monitor``.

Tunables (environment): ``TAU_HEALTH_THERMAL_C``, ``TAU_HEALTH_THERMAL_CLEAR_C``,
``TAU_HEALTH_CLEAN_SAMPLES``, ``TAU_HEALTH_MAX_CORDONED``, ``TAU_HEALTH_MAX_CORDONED_FRACTION``,
``TAU_HEALTH_MIN_CORDON_BUDGET``, ``TAU_HEALTH_PCIE_REPLAYS_PER_MIN``, ``TAU_HEALTH_EXPECTED_GPUS``.
"""

from __future__ import annotations

from taugrid.bus.service import Service, main
from taugrid.health.monitor import HealthMonitor, policy_from_env


async def start(svc: Service) -> None:
    monitor = HealthMonitor(svc.bus, policy=policy_from_env())
    svc.consume("health-monitor", monitor.handle)


if __name__ == "__main__":
    main("health-monitor", start)
