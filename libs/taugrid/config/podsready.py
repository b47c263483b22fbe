"""``platform.yaml``'s ``wait_for_pods_ready``: Kueue's ``waitForPodsReady`` (all-or-nothing start), in snake_case.

The shape and the defaults are those of Kueue's controller Configuration ``config.kueue.x-k8s.io/v1beta2`` in the
release taugrid pins (v0.19.2), where the block is on unless Kueue's ``DisableWaitForPodsReady`` feature gate is
set: ``enable`` (v1beta1's name) stands for that gate. The local cluster applies it itself
(``taugrid.local.podsready``); on Kubernetes it is Kueue's own setting, which ``tau platform render
--kueue-config`` writes out for the operator (``render.kueueconfig``). Invariants: every key is checked as
Kueue's config validation checks it (``pkg/config/validation.go``), plus a zero timeout, which Kueue would
silently replace by its default, is refused here.
"""

from __future__ import annotations

from typing import Literal

import pydantic
from pydantic import Field

from taugrid.config.fields import Duration, Strict

KUEUE_DEFAULT_TIMEOUT_S = 30 * 60  # v1beta2's DefaultWaitForPodsReadyTimeout
KUEUE_DEFAULT_BACKOFF_BASE_S = 60
KUEUE_DEFAULT_BACKOFF_MAX_S = 3600


class RequeuingStrategy(Strict):
    """How a workload evicted for not becoming ready in time goes back to its queue."""

    timestamp: Literal["Eviction", "Creation"] = Field(
        default="Eviction", description="its place in the queue: the eviction time (Eviction) or its creation")
    backoff_limit_count: int | None = Field(
        default=None, ge=0, description="requeues before it is deactivated (its run fails); null: no limit")
    backoff_base_seconds: int = Field(
        default=KUEUE_DEFAULT_BACKOFF_BASE_S, ge=0, description="the n-th requeue waits base * 2^(n-1) seconds")
    backoff_max_seconds: int = Field(
        default=KUEUE_DEFAULT_BACKOFF_MAX_S, ge=0, description="the longest wait before a requeue; 0: no cap")


class WaitForPodsReady(Strict):
    """An admitted workload whose pods are not all ready (running, or succeeded) within ``timeout`` of its
    admission is evicted, its quota released, and requeued after an exponential backoff."""

    enable: bool = Field(default=True, description="false: Kueue's DisableWaitForPodsReady feature gate")
    timeout: Duration = Field(default=float(KUEUE_DEFAULT_TIMEOUT_S),
                              description="from admission until every pod is ready, e.g. 5m")
    block_admission: bool = Field(
        default=False, description="admit nothing while an admitted workload is not ready yet")
    recovery_timeout: Duration | None = Field(
        default=None, description="a workload that was ready and lost a pod; default: timeout, 0 disables")
    requeuing_strategy: RequeuingStrategy = Field(default_factory=RequeuingStrategy)

    @pydantic.field_validator("timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("a zero timeout would evict every workload at admission; write how long its pods "
                             "may take to become ready, e.g. 5m (or enable: false to turn the check off)")
        return v

    def recovery_s(self) -> float:
        """Kueue's default: the recovery timeout is the timeout."""
        return self.timeout if self.recovery_timeout is None else self.recovery_timeout
