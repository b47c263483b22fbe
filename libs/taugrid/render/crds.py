"""Load CustomResourceDefinition schemas (KubeRay, Kueue) as JSON Schema validators.

The CRD files ship with the project in ``deploy/crds/`` (upstream Apache-2.0 files, see SOURCES.md there);
``TAUGRID_CRDS_DIR`` overrides the location. Each CRD's ``openAPIV3Schema`` for a served version is turned
into a draft 2020-12 JSON Schema:

* objects with declared ``properties`` reject unknown fields (as ``kubectl --validate=strict`` does), unless
  marked ``x-kubernetes-preserve-unknown-fields``;
* ``x-kubernetes-int-or-string`` accepts an integer or a string; ``nullable`` also accepts null;
* CEL rules (``x-kubernetes-validations``), defaults and formats are not checked;
* the top-level ``metadata`` (just ``type: object`` in a CRD) gets a small ObjectMeta schema.

Invariants: files are read lazily, once per process per (group, kind); lookups after that are dict hits.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from taugrid import settings
from taugrid.core.errors import PermanentError

CRDS_ENV = "TAUGRID_CRDS_DIR"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_OBJECT_META: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": ["integer", "null"]},
        "managedFields": {"type": "array"},
    },
    "additionalProperties": False,
}
# Keywords that mean nothing to a JSON Schema validator (or that we choose not to check) and only cost memory.
_DROP = {"description", "default", "format", "example", "externalDocs"}
_GROUP = re.compile(r"^\s{2}group:\s*(\S+)\s*$", re.MULTILINE)
_KIND = re.compile(r"^\s{4}kind:\s*(\S+)\s*$", re.MULTILINE)


# libs/taugrid/render/crds.py → repository root is four levels up. Resolved once: crds_dir is asked for every
# manifest validated, and resolving the path there cost more than the settings lookup (~0.1 ms).
_SHIPPED = Path(__file__).resolve().parents[3] / "deploy" / "crds"


def crds_dir() -> Path:
    """``TAUGRID_CRDS_DIR`` (the settings' ``renderer.crds_dir``), else the ``deploy/crds`` shipped here."""
    given = settings.current().renderer.crds_dir
    return given if given is not None else _SHIPPED


@dataclass(frozen=True)
class _Crd:
    path: Path
    group: str
    kind: str


_lock = threading.Lock()
_index: dict[tuple[str, str], _Crd] | None = None
_index_dir: Path | None = None
_validators: dict[tuple[str, str, str], jsonschema.protocols.Validator] = {}


def _load_index(directory: Path) -> dict[tuple[str, str], _Crd]:
    """(group, kind) → file, read from each file's head only (the big schemas are parsed on first use)."""
    index: dict[tuple[str, str], _Crd] = {}
    for path in sorted(directory.glob("*.yaml")):
        with path.open(encoding="utf-8") as fh:
            head = fh.read(4096)
        group, kind = _GROUP.search(head), _KIND.search(head)
        if group and kind:
            index[(group.group(1), kind.group(1))] = _Crd(path, group.group(1), kind.group(1))
    return index


def _crd_for(group: str, kind: str) -> _Crd | None:
    global _index, _index_dir
    directory = crds_dir()
    if _index is None or _index_dir != directory:
        _index, _index_dir = _load_index(directory), directory
        _validators.clear()
    return _index.get((group, kind))


def is_crd_kind(api_version: str, kind: str) -> bool:
    group = api_version.partition("/")[0] if "/" in api_version else ""
    with _lock:
        return _crd_for(group, kind) is not None


def validator_for(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """A cached validator for ``kind`` at ``api_version`` (``group/version``); PermanentError if unknown."""
    group, _, version = api_version.partition("/")
    key = (group, version, kind)
    with _lock:
        cached = _validators.get(key)
        if cached is not None:
            return cached
        crd = _crd_for(group, kind)
        if crd is None:
            raise PermanentError(f"no CRD for {kind} in group {group!r} under {crds_dir()}")
        with crd.path.open(encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        # Build every served version at once: the file is parsed only once.
        for entry in doc["spec"]["versions"]:
            if not entry.get("served", False):
                continue
            schema = convert(entry["schema"]["openAPIV3Schema"])
            schema.setdefault("properties", {})["metadata"] = _OBJECT_META
            schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
            _validators[(group, entry["name"], kind)] = jsonschema.Draft202012Validator(schema)
        served = sorted(v for (g, v, k) in _validators if g == group and k == kind)
        if key not in _validators:
            raise PermanentError(
                f"{kind} has no served version {version!r} in {crd.path.name}; served: {', '.join(served)}"
            )
        return _validators[key]


def convert(node: Any) -> Any:
    """One structural OpenAPI v3 schema node → JSON Schema (draft 2020-12), recursively."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: convert(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = convert(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [convert(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["type"] = ["integer", "string"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    # OpenAPI 3.0 booleans → draft 2020-12 numbers.
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool) and out.pop(bound) and limit in out:
            out[bound] = out.pop(limit)
    return out
