"""Turn a ResolvedRun into Kubernetes manifests (plain dicts), fingerprint them, print them, check them.

Public API:

* ``render(run, *, attempt, resume_from="", exclude_nodes=(), settings=RenderSettings())`` → list of
  manifests (Job [+ headless Service] or RayJob); ``exclude_nodes`` (a retry after a GPU/node fault) adds a
  required ``kubernetes.io/hostname NotIn`` node affinity to every pod template; every pod of a run with a
  source snapshot gets the source-fetch init container described in ``render/source.py``, built from
  ``settings`` (``RenderSettings.from_env()`` in the renderer service);
* ``manifest_digest(manifests)`` → ``sha256:<hex>`` of canonical JSON (sorted keys, no whitespace);
* ``to_yaml(manifests)`` → multi-document YAML with sorted keys, for ``tau run --dry-run``;
* ``validate(manifest)`` → None, or ``PermanentError`` listing every schema problem;
* ``object_name(run_id, attempt)`` → the stable object name of an attempt;
* ``with_annotation(manifests, key, value)`` → annotated copies (objects and pod templates), for what the
  renderer service stamps after digesting (``TRACEPARENT_ANNOTATION``).

Invariants: rendering is pure and deterministic (same run + attempt + resume point + exclusions ⇒
byte-identical manifests and digest); every top-level object is created suspended with the Kueue queue label
and the ``taugrid.io/*`` metadata. Nothing per-delivery (the trace context) is rendered: the renderer service
stamps ``taugrid.io/traceparent`` onto the objects it applies, after computing the digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import yaml

from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import PermanentError
from taugrid.render.common import (
    DEFAULT_IMAGE,
    TRACEPARENT_ANNOTATION,
    Manifest,
    object_name,
    with_annotation,
)
from taugrid.render.job import render_job
from taugrid.render.rayjob import render_rayjob
from taugrid.render.source import DEFAULT_SETTINGS, SOURCE_DIR, RenderSettings
from taugrid.render.validate import KUBERNETES_VERSION, validate

__all__ = [
    "DEFAULT_IMAGE",
    "KUBERNETES_VERSION",
    "Manifest",
    "RenderSettings",
    "SOURCE_DIR",
    "TRACEPARENT_ANNOTATION",
    "canonical_json",
    "manifest_digest",
    "object_name",
    "render",
    "render_job",
    "render_rayjob",
    "to_yaml",
    "validate",
    "with_annotation",
]


def render(
    run: ResolvedRun,
    *,
    attempt: int,
    resume_from: str = "",
    exclude_nodes: Sequence[str] = (),
    settings: RenderSettings = DEFAULT_SETTINGS,
) -> list[Manifest]:
    """Manifests for one attempt of ``run``, dispatched on ``run.engine``; ``settings`` say where the
    source-fetch init container comes from and how it reaches the bus."""
    if attempt < 0:
        raise PermanentError(f"attempt must be ≥ 0, got {attempt}")
    kw: dict[str, Any] = dict(
        attempt=attempt, resume_from=resume_from, exclude_nodes=exclude_nodes, settings=settings
    )
    if run.engine == "job":
        return render_job(run, **kw)
    if run.engine == "ray":
        return render_rayjob(run, **kw)
    raise PermanentError(f"engine {run.engine!r} is not supported; use `engine: job` or `engine: ray`")


def canonical_json(manifests: list[dict[str, Any]]) -> bytes:
    return json.dumps(manifests, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_digest(manifests: list[dict[str, Any]]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(manifests)).hexdigest()


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (``runtimeEnvYAML``) as literal blocks so they stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(manifests: list[dict[str, Any]]) -> str:
    return yaml.dump_all(
        manifests, Dumper=_Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=120
    )
