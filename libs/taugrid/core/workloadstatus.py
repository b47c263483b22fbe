"""What a Kueue Workload's conditions say about it, read the same way by the dispatcher (a site's reports) and by a
Kubernetes site's kube-bridge (its own Workloads). Pure: dicts in, answers out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def admitted(workload: Mapping[str, Any]) -> bool:
    """Whether a Workload holds quota in its cluster (Kueue's QuotaReserved, or Admitted, is True)."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("QuotaReserved", "Admitted") and c.get("status") == "True" for c in conditions)


def preempted(workload: Mapping[str, Any]) -> str:
    """Why a Workload's cluster preempted it (Kueue's Evicted is True with reason Preempted and it holds no quota
    now): the condition's message; "" otherwise. Other evictions (a PodsReady timeout, a deactivation) are
    retried by that cluster as before and reopen nothing."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    why = next((c for c in conditions if c.get("type") == "Evicted" and c.get("status") == "True"
                and c.get("reason") == "Preempted"), None)
    if why is None or admitted(workload):
        return ""
    return str(why.get("message") or "no message")
