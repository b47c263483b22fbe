"""Turn a ResolvedRun into Kubernetes manifests (plain dicts), fingerprint them, print them, check them.

Public API:

* ``render(run, *, attempt, resume_from="")`` → list of manifests (Job [+ headless Service] or RayJob);
* ``manifest_digest(manifests)`` → ``sha256:<hex>`` of canonical JSON (sorted keys, no whitespace);
* ``to_yaml(manifests)`` → multi-document YAML with sorted keys, for ``tau run --dry-run``;
* ``validate(manifest)`` → None, or ``PermanentError`` listing every schema problem;
* ``object_name(run_id, attempt)`` → the stable object name of an attempt.

Invariants: rendering is pure and deterministic (same run + attempt ⇒ byte-identical manifests and digest);
every top-level object is created suspended with the Kueue queue label and the ``taugrid.io/*`` metadata.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import PermanentError
from taugrid.render.common import DEFAULT_IMAGE, Manifest, object_name
from taugrid.render.job import render_job
from taugrid.render.rayjob import render_rayjob
from taugrid.render.validate import KUBERNETES_VERSION, validate

__all__ = [
    "DEFAULT_IMAGE",
    "KUBERNETES_VERSION",
    "Manifest",
    "manifest_digest",
    "object_name",
    "render",
    "render_job",
    "render_rayjob",
    "to_yaml",
    "validate",
]


def render(run: ResolvedRun, *, attempt: int, resume_from: str = "") -> list[Manifest]:
    """Manifests for one attempt of ``run``, dispatched on ``run.engine``."""
    if attempt < 0:
        raise PermanentError(f"attempt must be ≥ 0, got {attempt}")
    if run.engine == "job":
        return render_job(run, attempt=attempt, resume_from=resume_from)
    if run.engine == "ray":
        return render_rayjob(run, attempt=attempt, resume_from=resume_from)
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
