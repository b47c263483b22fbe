"""What a watch change carries on the bus: the object less what no consumer of K8S reads (issue 27).

A watched object is stored in K8S (7 days) once per change, and most of it is the spec we rendered ourselves,
which lives elsewhere (the manifests in ``render.applied`` and the evidence bundle): a trivial local run's pod,
job and workload were ~2 KB each, eight changes a run. The one consumer, the admission watcher
(``kube/translate.py``, ``kube/progress.py``, ``services/admission_watcher``), reads an object's metadata
(name, namespace, uid, labels, annotations, owners, resourceVersion) and status, and of its spec only:

- Pod: ``nodeName`` and each init and app container's ``name`` and ``image``;
- Workload: ``queueName``, ``active`` (false once Kueue deactivated it: an audit of the stream shows why the
  run ended without reading the events), and each pod set's ``name``, ``count`` and template metadata
  (labels, annotations: how a real Kueue Workload is told ours and carries the run's traceparent);
- Job, RayJob, RayCluster: nothing.

So ``slim`` keeps exactly that for those kinds and drops ``metadata.managedFields``, kubectl's last-applied
annotation and the renderer's provenance annotations (``PROVENANCE``: config hash, source digest, submission
id, workspace, run name; ~250 bytes on each of a run's Job changes, issue 27: the manifests keep them, and the
watcher reads the run, workspace and attempt from the labels) of every kind, and in the status of those kinds
the empty strings of conditions and container states (Kubernetes leaves an empty field out, so every reader
already takes a missing ``reason`` or ``message`` as ""); other kinds (core Events, ClusterQueues, nodes) go as
they are. Pure.
``tests/kube/test_watched.py`` checks that every object the translation and progress tests read translates the
same slimmed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# The renderer's annotations (render/common.py) that no consumer of K8S reads; the traceparent, the queue
# position, the run-labelled mark, the preemptor, the resize and the environment annotations stay.
PROVENANCE = frozenset({"taugrid.io/config-hash", "taugrid.io/source-digest", "taugrid.io/submission-id",
                        "taugrid.io/workspace", "taugrid.io/run-name"})
_DROPPED_ANNOTATIONS = PROVENANCE | {LAST_APPLIED}
_CONTAINER_KEYS = ("name", "image")
_SPEC_DROPPED = ("Job", "RayJob", "RayCluster")
_KNOWN = frozenset({"Pod", "Workload", *_SPEC_DROPPED})


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` as a watch change carries it on the bus; ``obj`` itself is left as it is."""
    out = dict(obj)
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        out["metadata"] = _metadata(meta)
    spec = obj.get("spec")
    kind = str(obj.get("kind") or "")
    status = obj.get("status")
    if kind in _KNOWN and isinstance(status, Mapping):
        out["status"] = _status(status)
    if not isinstance(spec, Mapping):
        return out
    if kind == "Pod":
        out["spec"] = _pod_spec(spec)
    elif kind == "Workload":
        out["spec"] = _workload_spec(spec)
    elif kind in _SPEC_DROPPED:
        del out["spec"]
    return out


def _metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and not _DROPPED_ANNOTATIONS.isdisjoint(annotations):
        out["annotations"] = {k: v for k, v in annotations.items() if k not in _DROPPED_ANNOTATIONS}
    return out


def _status(status: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(status)
    if isinstance(status.get("conditions"), list):
        out["conditions"] = [_unempty(c) for c in status["conditions"]]
    for key in ("containerStatuses", "initContainerStatuses"):
        if isinstance(status.get(key), list):
            out[key] = [_container_status(cs) for cs in status[key]]
    return out


def _container_status(cs: Any) -> Any:
    if not isinstance(cs, Mapping):
        return cs
    out = dict(cs)
    for key in ("state", "lastState"):
        if isinstance(cs.get(key), Mapping):
            out[key] = {name: _unempty(detail) for name, detail in cs[key].items()}
    return out


def _unempty(item: Any) -> Any:
    """A condition or container state less its fields that are the empty string."""
    return {k: v for k, v in item.items() if v != ""} if isinstance(item, Mapping) else item


def _containers(items: Any) -> list[dict[str, Any]]:
    return [{k: ct[k] for k in _CONTAINER_KEYS if k in ct} for ct in items or [] if isinstance(ct, Mapping)]


def _pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "nodeName" in spec:
        out["nodeName"] = spec["nodeName"]
    for key in ("initContainers", "containers"):
        if key in spec:
            out[key] = _containers(spec[key])
    return out


def _workload_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("queueName", "active"):
        if key in spec:
            out[key] = spec[key]
    if "podSets" in spec:
        out["podSets"] = [_pod_set(ps) for ps in spec["podSets"] or [] if isinstance(ps, Mapping)]
    return out


def _pod_set(ps: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: ps[k] for k in ("name", "count") if k in ps}
    template = ps.get("template")
    if isinstance(template, Mapping):
        meta = template.get("metadata")
        out["template"] = {"metadata": _metadata(meta)} if isinstance(meta, Mapping) else {}
    return out
