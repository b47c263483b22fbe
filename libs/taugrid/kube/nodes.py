"""Carry the health monitor's decisions out on a Kubernetes cluster: cordon, uncordon, drain, node conditions.

* ``cordon`` / ``uncordon`` change ``spec.unschedulable`` and our taint ``taugrid.io/unhealthy=<condition>:
  NoSchedule`` in one read-modify-write JSON merge patch guarded by ``metadata.resourceVersion`` (a 409
  conflict re-reads). Not server-side apply: ``NodeSpec.taints`` is an *atomic* list for SSA, so applying a
  list that holds only our taint would replace every other taint on the node (the node controller's, the GPU
  operator's, the autoscaler's) and take ownership of them all. The patch keeps every foreign taint as read.
  Our taint marks our cordon: ``uncordon`` clears ``unschedulable`` only on a node that carries it, so a node
  that someone else cordoned is never ours to uncordon.
* ``set_condition`` server-side-applies one node condition ``Taugrid<Type>`` (``Taugrid<Type>Gpu<n>`` for a
  GPU-scoped one) on the ``status`` subresource. ``status.conditions`` is a map keyed by ``type`` for SSA, and
  each condition type has its own field manager (``<field_manager>-<condition type>``), so applying one
  condition never drops another.
* ``drain`` evicts (``policy/v1`` Eviction, honouring PodDisruptionBudgets) the pods on the node that carry
  ``taugrid.io/managed-by=taugrid``; system and foreign pods are never touched.
* ``request_reboot`` asks the cluster's reboot machinery for a reboot (repair step ``node-reboot``): with
  ``via="annotation"`` the annotation ``taugrid.io/reboot-requested=<time>`` (plus ``taugrid.io/reboot-reason``),
  which kured's ``--reboot-sentinel-command`` can test; with ``via="nodemaintenance"`` a medik8s
  ``NodeMaintenance`` (``nodemaintenance.medik8s.io/v1beta1``, cluster-scoped, ``taugrid-<node>``).
  ``mark_for_replacement`` annotates ``taugrid.io/needs-replacement``. ``uncordon`` drops the reboot annotations
  and ``end_maintenance`` deletes our NodeMaintenance (the operator then uncordons its side).

Idempotent: a cordon/uncordon that finds the node as wanted writes nothing; an identical apply changes
nothing; evicting a pod that is already gone (404) counts as evicted; a node that no longer exists has
nothing to act on. A PDB refusal (429) is a ``TemporaryError``: the caller retries the drain later.

Invariant: only ``taugrid.core.errors`` leave this module (``client`` translates everything).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from taugrid.core.contracts import NodeCondition
from taugrid.core.errors import NotFound, PermanentError, TemporaryError
from taugrid.kube.apply import APPLY_CONTENT_TYPE
from taugrid.kube.client import KubeApi, Resource, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR

log = logging.getLogger("taugrid.kube.nodes")

TAINT_KEY = "taugrid.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
REASON_ANNOTATION = "taugrid.io/cordon-reason"
REBOOT_ANNOTATION = "taugrid.io/reboot-requested"
REBOOT_REASON_ANNOTATION = "taugrid.io/reboot-reason"
REPLACE_ANNOTATION = "taugrid.io/needs-replacement"
REBOOT_VIA = ("annotation", "nodemaintenance")
MERGE_PATCH = "application/merge-patch+json"
CONDITION_PREFIX = "Taugrid"
PDB_RETRY_S = 10.0  # a PodDisruptionBudget frees up when a replacement is ready: seconds, not milliseconds

NODES = resource_for("Node")
NODE_MAINTENANCE = Resource("nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance", "nodemaintenances", False)
PODS = resource_for("Pod")

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


def taint_value(conditions: list[str]) -> str:
    """The first condition, made a valid label value (the taint's value must be one)."""
    value = _LABEL_VALUE.sub("-", conditions[0] if conditions else "Unknown")[:63].strip("-_.")
    return value or "Unknown"


def condition_type(cond: NodeCondition) -> str:
    return f"{CONDITION_PREFIX}{cond.type}" + ("" if cond.gpu is None else f"Gpu{cond.gpu}")


def _ours(taint: dict[str, Any]) -> bool:
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT_EFFECT


def _rfc3339(ts: float) -> str:
    when = datetime.fromtimestamp(ts, UTC) if ts > 0 else datetime.now(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeActuator:
    """Node-level actions through one ``KubeApi``, recorded under field manager ``field_manager``."""

    def __init__(
        self, api: KubeApi, *, field_manager: str = "taugrid-health", conflict_retries: int = 5
    ) -> None:
        self.api = api
        self.field_manager = field_manager
        self.conflict_retries = conflict_retries
        # Guarded writes go through a client that never repeats a request: after a 409 the same body with the
        # same resourceVersion can only fail again; the loop in _patch_node re-reads instead.
        self._guarded = KubeApi(api.api_client, retries=0)

    async def cordon(self, node: str, reason: str, *, conditions: list[str]) -> bool:
        """Mark ``node`` unschedulable with our taint. Returns whether anything changed."""
        want = {"key": TAINT_KEY, "value": taint_value(conditions), "effect": TAINT_EFFECT}

        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            spec = obj.get("spec") or {}
            taints = list(spec.get("taints") or [])
            ours = [t for t in taints if _ours(t)]
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if spec.get("unschedulable") and ours == [want] and annotations.get(REASON_ANNOTATION) == reason:
                return None
            kept = [t for t in taints if not _ours(t)]
            return {"metadata": {"annotations": {REASON_ANNOTATION: reason}},
                    "spec": {"unschedulable": True, "taints": [*kept, want]}}

        changed = await self._patch_node(node, change, what=f"cordon Node {node}")
        if changed:
            log.warning("%s: cordoned (taint %s=%s:%s): %s", node, TAINT_KEY, want["value"], TAINT_EFFECT,
                        reason)
        return changed

    async def uncordon(self, node: str, reason: str) -> bool:
        """Undo our cordon: drop our taint and (the taint shows the cordon was ours) ``unschedulable``."""

        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            taints = list((obj.get("spec") or {}).get("taints") or [])
            if not any(_ours(t) for t in taints):
                return None  # not cordoned by us (or already uncordoned): not ours to touch
            return {"metadata": {"annotations": {REASON_ANNOTATION: None, REBOOT_ANNOTATION: None,
                                                 REBOOT_REASON_ANNOTATION: None, REPLACE_ANNOTATION: None}},
                    "spec": {"unschedulable": False, "taints": [t for t in taints if not _ours(t)]}}

        changed = await self._patch_node(node, change, what=f"uncordon Node {node}")
        if changed:
            log.info("%s: uncordoned: %s", node, reason)
        return changed

    async def request_reboot(self, node: str, reason: str, *, at: float, via: str = "annotation") -> bool:
        """Ask for ``node`` to be rebooted (see the module docstring). Returns whether anything was written."""
        if via not in REBOOT_VIA:
            raise PermanentError(f"reboot via {via!r}: use one of {', '.join(REBOOT_VIA)} "
                                 "(TAU_HEALTH_REBOOT_VIA)")
        if via == "nodemaintenance":
            name = f"taugrid-{node}"[:253]
            body = {"apiVersion": NODE_MAINTENANCE.api_version, "kind": NODE_MAINTENANCE.kind,
                    "metadata": {"name": name, "labels": {"taugrid.io/managed-by": "taugrid"}},
                    "spec": {"nodeName": node, "reason": reason}}
            await self.api.request("PATCH", NODE_MAINTENANCE.path(None, name), what=f"apply NodeMaintenance {name}",
                                   body=body, content_type=APPLY_CONTENT_TYPE,
                                   query={"fieldManager": self.field_manager, "force": "true"})
            log.warning("%s: NodeMaintenance %s applied: %s", node, name, reason)
            return True
        when = _rfc3339(at)

        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if annotations.get(REBOOT_ANNOTATION) == when:
                return None
            return {"metadata": {"annotations": {REBOOT_ANNOTATION: when, REBOOT_REASON_ANNOTATION: reason}}}

        changed = await self._patch_node(node, change, what=f"request a reboot of Node {node}")
        if changed:
            log.warning("%s: reboot requested (%s=%s): %s", node, REBOOT_ANNOTATION, when, reason)
        return changed

    async def end_maintenance(self, node: str) -> None:
        """Delete our NodeMaintenance for ``node``, if any (a 404 is already done)."""
        name = f"taugrid-{node}"[:253]
        try:
            await self.api.request("DELETE", NODE_MAINTENANCE.path(None, name), what=f"delete NodeMaintenance {name}")
        except NotFound:
            return

    async def mark_for_replacement(self, node: str, reason: str) -> bool:
        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if annotations.get(REPLACE_ANNOTATION) == reason:
                return None
            return {"metadata": {"annotations": {REPLACE_ANNOTATION: reason}}}

        return await self._patch_node(node, change, what=f"mark Node {node} for replacement")

    async def set_condition(self, cond: NodeCondition) -> None:
        """Server-side apply ``cond`` as a node condition (how NPD and NVIDIA's stack report GPU faults)."""
        ctype = condition_type(cond)
        message = cond.message if cond.gpu is None else f"GPU {cond.gpu}: {cond.message}"
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": cond.node},
            "status": {"conditions": [{
                "type": ctype,
                "status": cond.status,
                "reason": cond.reason or cond.type,
                "message": message,
                "lastTransitionTime": _rfc3339(cond.time),
            }]},
        }
        try:
            await self.api.request(
                "PATCH", NODES.path(None, cond.node) + "/status",
                what=f"set condition {ctype} on Node {cond.node}", body=body, content_type=APPLY_CONTENT_TYPE,
                query={"fieldManager": f"{self.field_manager}-{ctype}"[:128], "force": "true"},
            )
        except NotFound:
            log.warning("%s: node is gone; condition %s=%s not recorded", cond.node, ctype, cond.status)

    async def drain(self, node: str, *, grace_s: int = 30) -> int:
        """Evict our pods on ``node``; returns how many evictions were accepted (or found the pod gone).

        Raises ``TemporaryError`` when any eviction was refused (a PodDisruptionBudget: 429) after trying all
        of them, so a retry evicts only what is left.
        """
        listing = await self.api.request(
            "GET", PODS.path(), what=f"list our pods on Node {node}",
            query={"fieldSelector": f"spec.nodeName={node}", "labelSelector": MANAGED_SELECTOR},
        )
        evicted, refused = 0, []
        delay = PDB_RETRY_S
        for pod in listing.get("items") or []:
            meta = pod.get("metadata") or {}
            ns, name = meta.get("namespace") or "default", meta.get("name") or ""
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue  # finished: nothing runs there
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": ns},
                    "deleteOptions": {"gracePeriodSeconds": max(0, int(grace_s))}}
            try:
                await self.api.request("POST", PODS.path(ns, name) + "/eviction",
                                       what=f"evict Pod {ns}/{name} from Node {node}", body=body)
            except NotFound:
                evicted += 1  # already gone
                continue
            except TemporaryError as err:
                refused.append(f"{ns}/{name} ({err})")
                delay = max(delay, err.delay)
                continue
            evicted += 1
            log.warning("%s: evicted pod %s/%s", node, ns, name)
        if refused:
            raise TemporaryError(
                f"drain Node {node}: {len(refused)} eviction(s) refused, retrying later "
                f"(a PodDisruptionBudget allows no disruption now?): {'; '.join(refused)}", delay=delay)
        return evicted

    async def _patch_node(
        self, node: str, change: Callable[[dict[str, Any]], dict[str, Any] | None], *, what: str
    ) -> bool:
        """Read the node, compute a merge patch, write it only if the node is unchanged since the read."""
        path = NODES.path(None, node)
        for attempt in range(self.conflict_retries):
            try:
                obj = await self.api.request("GET", path, what=f"get Node {node}")
            except NotFound:
                log.warning("%s: node is gone; nothing to %s", node, what.split()[0])
                return False
            patch = change(obj)
            if patch is None:
                return False
            patch["metadata"]["resourceVersion"] = (obj.get("metadata") or {}).get("resourceVersion")
            try:
                await self._guarded.request("PATCH", path, what=what, body=patch, content_type=MERGE_PATCH,
                                            query={"fieldManager": self.field_manager})
                return True
            except NotFound:
                return False
            except TemporaryError as err:  # 409 "has been modified", 429, 5xx: read again and recompute
                if attempt == self.conflict_retries - 1:
                    raise
                await asyncio.sleep(min(err.delay, 1.0) if "has been modified" not in str(err) else 0.0)
        raise AssertionError("unreachable")
