"""``platform.yaml``'s ``wait_for_pods_ready`` as Kueue's controller Configuration writes it (Kueue has no API
object for it): the ``waitForPodsReady`` block of ``config.kueue.x-k8s.io/v1beta2``, for the operator to put in
Kueue's ``kueue-manager-config`` ConfigMap (``tau platform render`` says so on stderr).

Invariants: the names are Kueue v0.19.2's (``apis/config/v1beta2`` ``WaitForPodsReady`` and
``RequeuingStrategy``); durations are Go duration strings, which Kueue's ``metav1.Duration`` parses; a block
equal to Kueue's defaults needs nothing set (``None``); ``enable: false`` is Kueue's ``DisableWaitForPodsReady``
feature gate, since v1beta2 has no ``enable``.
"""

from __future__ import annotations

from typing import Any

from taugrid.config.platform import Platform
from taugrid.config.podsready import WaitForPodsReady

CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
DISABLE_GATE = "DisableWaitForPodsReady"


def go_duration(seconds: float) -> str:
    """``1800`` → ``30m``, ``90`` → ``1m30s``, ``0.5`` → ``500ms``: what Go's ``time.ParseDuration`` reads."""
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    rest = seconds - whole
    h, m, s = whole // 3600, whole % 3600 // 60, whole % 60
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "")
    if s or rest or not out:
        out += f"{s + rest:g}s"
    return out


def wait_for_pods_ready(w: WaitForPodsReady) -> dict[str, Any]:
    """Kueue's ``waitForPodsReady`` for ``w`` (every field written, so the operator sees what taugrid assumes)."""
    strategy = w.requeuing_strategy
    block: dict[str, Any] = {"timeout": go_duration(w.timeout), "blockAdmission": w.block_admission,
                             "recoveryTimeout": go_duration(w.recovery_s()),
                             "requeuingStrategy": {"timestamp": strategy.timestamp,
                                                   "backoffLimitCount": strategy.backoff_limit_count,
                                                   "backoffBaseSeconds": strategy.backoff_base_seconds,
                                                   "backoffMaxSeconds": strategy.backoff_max_seconds}}
    return block


def configuration(p: Platform) -> dict[str, Any] | None:
    """The part of Kueue's Configuration the platform's ``wait_for_pods_ready`` needs; ``None`` when it is
    Kueue's default (unset, or written equal to it)."""
    w = p.wait_for_pods_ready
    if w == WaitForPodsReady():
        return None
    if not w.enable:
        return {"apiVersion": CONFIG_API_VERSION, "kind": "Configuration", "featureGates": {DISABLE_GATE: True}}
    return {"apiVersion": CONFIG_API_VERSION, "kind": "Configuration", "waitForPodsReady": wait_for_pods_ready(w)}


def note(p: Platform) -> str:
    """What to set in Kueue's ConfigMap for ``wait_for_pods_ready``, as YAML comment lines ("" when nothing)."""
    cfg = configuration(p)
    if cfg is None:
        return ""
    if "featureGates" in cfg:
        return ("# wait_for_pods_ready.enable: false is Kueue's feature gate; set it in the kueue-manager-config "
                f"ConfigMap ({CONFIG_API_VERSION}):\n#   featureGates: {{{DISABLE_GATE}: true}}\n")
    w = cfg["waitForPodsReady"]
    rs = w["requeuingStrategy"]
    limit = "null" if rs["backoffLimitCount"] is None else rs["backoffLimitCount"]
    return ("# wait_for_pods_ready is Kueue's controller Configuration, not an API object; set it in the "
            f"kueue-manager-config ConfigMap ({CONFIG_API_VERSION}):\n"
            f"#   waitForPodsReady:\n#     timeout: {w['timeout']}\n"
            f"#     blockAdmission: {str(w['blockAdmission']).lower()}\n"
            f"#     recoveryTimeout: {w['recoveryTimeout']}\n"
            f"#     requeuingStrategy: {{timestamp: {rs['timestamp']}, backoffLimitCount: {limit}, "
            f"backoffBaseSeconds: {rs['backoffBaseSeconds']}, backoffMaxSeconds: {rs['backoffMaxSeconds']}}}\n")
