"""Check a rendered manifest against its schema before anything is applied.

Core kinds (Job, Service, ConfigMap, …) use the strict JSON schemas that ship inside ``kubernetes-validate``
for ``KUBERNETES_VERSION`` (unknown fields are errors); CRD kinds (RayJob, RayCluster, Kueue objects) use the
CRD files, see ``taugrid.render.crds``. On top of the schemas, names and labels are checked the way the API
server checks them, since the JSON schemas leave them as plain strings.

Invariants: ``validate`` raises ``PermanentError`` listing every problem as ``<path>: <message>`` (a broken
manifest never gets better by retrying) and returns None otherwise; validators are built once per kind and
cached, so a warm call costs milliseconds.

Given ``varying`` (the renderer passes the run id and the submission id), a manifest the schema found clean is
remembered modulo those strings: a later manifest that differs from it only where they stand, by others of the
same lengths and the same kinds of characters (lower, upper, digit, other; same first and last), skips the schema
walk (a few ms of CPU per run, the renderer's largest cost in a burst of one config). That is the same verdict:
the schemas here type-check those strings (names, labels, env values, annotations) and no pattern or length rule
that could tell two such ids apart applies to them, and the name and label rules, which do look at the text, run
on every call. A manifest with problems is never remembered; the memory is bounded.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import msgspec
from kubernetes_validate import utils as kv_utils
from packaging.version import Version
from referencing import Registry, Resource

from taugrid.core.errors import PermanentError
from taugrid.render import crds

# The newest Kubernetes schema set shipped by kubernetes-validate 1.37; an older install falls back to the
# newest set it has that is not newer (never below MIN_KUBERNETES_VERSION).
KUBERNETES_VERSION = "1.37.0"
MIN_KUBERNETES_VERSION = "1.30.0"
KUBERNETES_VALIDATE_VERSION: str = kubernetes_validate.__version__

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Name rules per kind beyond "DNS-1123 subdomain": (pattern, max length, rule name).
_NAME_RULES: dict[str, tuple[re.Pattern[str], int, str]] = {
    "Service": (_DNS1035_LABEL, 63, "a DNS-1035 label"),
    "RayJob": (_DNS1035_LABEL, 47, "a DNS-1035 label of at most 47 characters (KubeRay)"),
    "RayCluster": (_DNS1035_LABEL, 53, "a DNS-1035 label of at most 53 characters (KubeRay)"),
    "Job": (_DNS1123_LABEL, 63, "a DNS-1123 label (it becomes the job-name pod label)"),
    "Namespace": (_DNS1123_LABEL, 63, "a DNS-1123 label"),
}

_lock = threading.Lock()
_CLEAN_MAX = 512  # manifests (modulo their run id) the schema found clean, remembered
_clean: OrderedDict[bytes, None] = OrderedDict()
_MASK = b"\x00"  # never in JSON text (it would be written \u0000), so a masked key cannot collide with real text
_core_validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
_core_registry: tuple[str, Registry] | None = None


def kubernetes_schema_version() -> str:
    """The schema set actually used: the newest shipped that is not newer than ``KUBERNETES_VERSION``."""
    target = Version(KUBERNETES_VERSION)
    shipped = [v for v in kv_utils.all_versions() if Version(v) <= target]
    if not shipped or Version(shipped[-1]) < Version(MIN_KUBERNETES_VERSION):
        raise PermanentError(
            f"kubernetes-validate {KUBERNETES_VALIDATE_VERSION} ships no schemas for Kubernetes ≥ "
            f"{MIN_KUBERNETES_VERSION}; upgrade it"
        )
    return str(shipped[-1])


def validate(manifest: dict[str, Any], *, varying: Sequence[str] = ()) -> None:
    """Raise ``PermanentError`` naming every schema problem in ``manifest``. ``varying``: strings (the run id, the
    submission id) modulo which a clean schema verdict is remembered (module docstring)."""
    if not isinstance(manifest, dict):
        raise PermanentError(f"a manifest must be a mapping, got {type(manifest).__name__}")
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise PermanentError("manifest has no apiVersion/kind strings; cannot pick a schema")
    masked = [v for v in varying if len(v) >= 8]  # a short string would mask parts of unrelated text
    key = _clean_key(manifest, masked) if masked else None
    with _lock:
        known = key is not None and key in _clean
        if known:
            _clean.move_to_end(key)  # type: ignore[arg-type]
    problems: list[str] = []
    if not known:
        if crds.is_crd_kind(api_version, kind):
            validator = crds.validator_for(api_version, kind)
        else:
            validator = _core_validator(api_version, kind)
        problems = [_describe(err) for err in validator.iter_errors(manifest)]
        if key is not None and not problems:
            with _lock:
                _clean[key] = None
                while len(_clean) > _CLEAN_MAX:
                    _clean.popitem(last=False)
    problems += _metadata_problems(kind, manifest.get("metadata"))
    if problems:
        meta = manifest.get("metadata")
        name = meta.get("name", "?") if isinstance(meta, dict) else "?"
        lines = "\n".join(f"  - {p}" for p in sorted(set(problems)))
        raise PermanentError(f"{kind}/{name} ({api_version}) is invalid:\n{lines}")


def _kinds(text: str) -> bytes:
    """Which kinds of characters ``text`` holds (a = lower, A = upper, 0 = digit, . = other)."""
    return "".join(sorted({"a" if c.islower() else "A" if c.isupper() else "0" if c.isdigit() else "."
                           for c in text})).encode()


def _clean_key(manifest: dict[str, Any], varying: list[str]) -> bytes:
    """The manifest's JSON with each of ``varying`` masked (the longest first, each by its own mark), prefixed by
    what a schema rule could still tell apart: each one's length, the kinds of its characters, and those of its
    first and last character."""
    text = msgspec.json.encode(manifest)
    head = b""
    for i, value in sorted(enumerate(varying), key=lambda iv: -len(iv[1])):
        text = text.replace(value.encode(), _MASK + bytes([65 + i]) + _MASK)
    for value in varying:
        head += b"%d|%s|%s|%s|" % (len(value), _kinds(value), _kinds(value[0]), _kinds(value[-1]))
    return head + text


def _core_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    global _core_registry
    key = (api_version, kind)
    with _lock:
        cached = _core_validators.get(key)
        if cached is not None:
            return cached
        version = kubernetes_schema_version()
        schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
        if _core_registry is None or _core_registry[0] != version:
            defs = kv_utils.schema_contents(f"{schema_dir}/_definitions.json", version)
            _core_registry = (version, Resource.from_contents(defs) @ Registry())
        # Same file naming as kubernetes_validate.validate: rbac.authorization.k8s.io/v1 → rbac-v1.
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = kv_utils.schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", version)
        except FileNotFoundError:
            raise PermanentError(
                f"no schema for kind {kind} at apiVersion {api_version} (Kubernetes {version}, and no CRD in "
                f"{crds.crds_dir()})"
            ) from None
        registry = Resource.from_contents(schema) @ _core_registry[1]
        validator = jsonschema.Draft202012Validator(schema, registry=registry)
        _core_validators[key] = validator
        return validator


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _describe(err: jsonschema.ValidationError) -> str:
    path = _path(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set((err.schema or {}).get("properties", {})) if isinstance(err.schema, dict) else set()
        unknown = sorted(k for k in err.instance if k not in allowed)
        if unknown:
            where = "" if path == "<root>" else f"{path}."
            return "; ".join(f"{where}{k}: unknown field" for k in unknown)
    if err.validator in ("oneOf", "anyOf") and err.context:
        # k8s int-or-string / quantity: say what was expected instead of "not valid under any schema".
        types: set[str] = set()
        for sub in err.context:
            declared = sub.schema.get("type") if isinstance(sub.schema, dict) else None
            types.update([declared] if isinstance(declared, str) else declared or [])
        accepted = " or ".join(sorted(types - {"null"})) or "another shape"
        return f"{path}: {err.instance!r} is not of type {accepted}"
    return f"{path}: {err.message}"


def _metadata_problems(kind: str, meta: Any) -> list[str]:
    if not isinstance(meta, dict):
        return ["metadata: missing"]
    problems: list[str] = []
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: missing")
    else:
        pattern, max_len, rule = _NAME_RULES.get(kind, (_DNS1123_SUBDOMAIN, 253, "a DNS-1123 subdomain"))
        if len(name) > max_len or not pattern.match(name):
            problems.append(f"metadata.name: {name!r} must be {rule} (≤ {max_len} characters)")
    labels = meta.get("labels")
    if isinstance(labels, dict):
        for key, value in labels.items():
            if not _label_key_ok(str(key)):
                problems.append(f"metadata.labels.{key}: invalid label key")
            if isinstance(value, str) and (len(value) > 63 or not _LABEL_VALUE.match(value)):
                problems.append(f"metadata.labels.{key}: {value!r} is not a valid label value (≤ 63 chars)")
    return problems


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))
