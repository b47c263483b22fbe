"""``policy.elastic``: the size range of an elastic run (``policy.mode: elastic``) and how it may change.

TauGrid has only ``policy.mode: fixed | elastic`` (and the ``elastic`` lane); the range is taugrid's own, kept
minimal: ``min`` and ``max`` pods of the resizable pod set (torchrun nodes for ``engine: job``, Ray workers for
``engine: ray``), ``step`` (pods added per growth) and ``cooldown`` (seconds between two resizes, so a run does
not flap when quota comes and goes). The written size (``execution.nodes`` / ``compute.workers``) is where the
run starts and must lie in the range.

Invariant: ``elastic_rules`` never raises; it reports every problem through ``add`` with the field and the fix.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from taugrid.config.fields import Duration, Strict


class ElasticRange(Strict):
    min: int = Field(ge=1, description="taugrid: fewest pods the run keeps (it is never shrunk below)")
    max: int | None = Field(default=None, ge=1, description="taugrid: most pods (default: the written size)")
    step: int = Field(default=1, ge=1, description="taugrid: pods added by one growth")
    cooldown: Duration = Field(default=60.0, ge=0, description="taugrid: seconds between two resizes, e.g. 2m")


def resizable_size(cfg: Any) -> tuple[tuple[str, str], int]:
    """The key holding the run's resizable size and its value: Ray workers, else torchrun nodes."""
    if cfg.engine == "ray":
        return ("compute", "workers"), cfg.compute.workers or 1
    return ("execution", "nodes"), cfg.execution.nodes


def elastic_bounds(cfg: Any) -> tuple[int, int] | None:
    """(min, max) of an elastic run, None for a fixed one. Valid only after ``elastic_rules`` passed."""
    p = cfg.policy
    if p.mode != "elastic" or p.elastic is None:
        return None
    _, size = resizable_size(cfg)
    return p.elastic.min, p.elastic.max if p.elastic.max is not None else size


def elastic_rules(cfg: Any, add: Any) -> bool:
    """Check ``policy.mode: elastic`` with ``policy.elastic``; True when the run is elastic and well formed."""
    p = cfg.policy
    if p.elastic is not None and p.mode != "elastic":
        add(("policy", "elastic"), "sizes an elastic run, but policy.mode is not elastic",
            "set policy.mode: elastic, or remove policy.elastic")
        return False
    if p.mode != "elastic":
        return False
    if p.elastic is None:
        add(("policy", "mode"), "an elastic run needs its size range",
            "add policy.elastic with min (and max, default the written size), e.g. {min: 2, max: 4}")
        return False
    ok = True
    if cfg.engine == "job" and cfg.execution.launcher != "torchrun":
        add(("policy", "mode"), "only torchrun (engine: job) and Ray workers (engine: ray) can change size "
            "while running", "set execution.launcher: torchrun, or use engine: ray")
        ok = False
    if cfg.engine == "ray" and cfg.execution.launcher == "ray-tune":
        add(("policy", "mode"), "a Ray Tune run sizes its trials itself; its worker group is not resized",
            "remove policy.mode, or use execution.launcher: ray-train")
        ok = False
    key, size = resizable_size(cfg)
    e = p.elastic
    high = e.max if e.max is not None else size
    where = ".".join(key)
    if e.min > high:
        add(("policy", "elastic", "min"), f"min {e.min} is above max {high}", f"set min to at most {high}")
        return False
    if not e.min <= size <= high:
        add(key, f"{where}={size} is outside policy.elastic [{e.min}, {high}]; the run starts at {where}",
            f"set {where} between {e.min} and {high}")
        ok = False
    if e.min == high:
        add(("policy", "elastic"), f"min = max = {high}: the run can never change size",
            "raise max above min, or set policy.mode: fixed")
        ok = False
    elif e.step > high - e.min:
        add(("policy", "elastic", "step"), f"step {e.step} is larger than the range {e.min}..{high}",
            f"set step to at most {high - e.min}")
        ok = False
    if cfg.compute.gang is False:
        ok = False  # refused by taurules._gang already
    return ok
