"""What ``tau platform apply`` changes: a platform file merged onto the stored revision, and the diff.

The stored platform revision is the one source of truth for people (``users``, ``groups``, workspace ``members``
and ``admins``); ``tau admin user`` edits it exactly. A file applied onto it replaces the policy (queues, quotas,
flavors, profiles, workspaces) but keeps every user, group and membership the file does not mention
(``merge_people``), so a file written before someone was added never removes them; ``--prune`` takes the file
as it is. Invariants: pure (no I/O); ``merge_people`` with nothing to keep returns the file's platform itself;
``diff(p, p)`` is empty; every change names its kind, its name and, for a changed entry, each field that
changed with its old and new value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from taugrid.config.platform import Platform, User, Workspace

Action = Literal["add", "remove", "change", "keep"]
_MARK: dict[Action, str] = {"add": "+", "remove": "-", "change": "~", "keep": "="}


@dataclass(frozen=True)
class Change:
    """One entry of one section (``kind`` is the section's singular noun: workspace, user, cluster_queue, …)."""

    kind: str
    name: str
    action: Action
    details: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        head = f"{_MARK[self.action]} {self.kind} {self.name}"
        if len(self.details) == 1 and self.action != "change":
            return [f"{head}: {self.details[0]}"]
        return [head, *(f"    {d}" for d in self.details)]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "action": self.action, "details": list(self.details)}


@dataclass(frozen=True)
class Merged:
    platform: Platform
    kept: tuple[Change, ...]  # the people and memberships the file did not mention, kept from the stored revision


def merge_people(stored: Platform, file: Platform, *, file_name: str = "the file") -> Merged:
    """``file`` plus the users, groups and workspace memberships ``stored`` has and ``file`` does not mention.

    A stored user the file lists is the file's (its key, role and groups win); one whose key the file gives to
    another name is not kept (a rename). Memberships are kept only in workspaces the file still has."""
    names = {u.name for u in file.users}
    keys = {u.nkey for u in file.users}
    users = [u for u in stored.users if u.name not in names and u.nkey not in keys]
    taken = {g.name for g in file.groups} | names
    groups = [g for g in stored.groups if g.name not in taken]
    principals = names | {u.name for u in users} | {g.name for g in [*file.groups, *groups]}
    kept: list[Change] = [Change("user", u.name, "keep", (_kept_user(u, file_name),)) for u in users]
    kept += [Change("group", g.name, "keep", (f"not in {file_name}; kept (--prune removes it)",)) for g in groups]
    workspaces: list[Workspace] = []
    for ws in file.workspaces:
        old = stored.workspace(ws.name)
        extra = {key: [m for m in getattr(old, key) if m not in getattr(ws, key) and m in principals]
                 for key in ("members", "admins")} if old is not None else {}
        if any(extra.values()):
            ws = ws.model_copy(update={k: [*getattr(ws, k), *v] for k, v in extra.items()})
            kept.append(Change("workspace", ws.name, "keep", tuple(
                f"{key} {', '.join(v)} kept, not in {file_name}" for key, v in extra.items() if v)))
        workspaces.append(ws)
    if not kept:
        return Merged(file, ())
    return Merged(file.model_copy(update={"users": [*file.users, *users], "groups": [*file.groups, *groups],
                                          "workspaces": workspaces}), tuple(kept))


def _kept_user(user: User, file_name: str) -> str:
    return (f"not in {file_name}; kept with their memberships (`tau admin user remove {user.name}` or --prune "
            "removes them)")


def _key(entry: dict[str, Any]) -> str:
    return f"{entry['namespace']}/{entry['name']}" if "namespace" in entry and "cluster_queue" in entry \
        else str(entry.get("name"))


# (kind, how to read the section's entries from a platform dump), in the order a diff lists them
_SECTIONS: tuple[tuple[str, Callable[[dict[str, Any]], list[dict[str, Any]]]], ...] = (
    ("workspace", lambda d: d["workspaces"]),
    ("user", lambda d: d["users"]),
    ("group", lambda d: d["groups"]),
    ("cluster_queue", lambda d: [_quotas_flat(q) for q in d["cluster_queues"]]),
    ("local_queue", lambda d: d["local_queues"]),
    ("cohort", lambda d: d["cohorts"]),
    ("topology", lambda d: d["topologies"]),
    ("resource_flavor", lambda d: d["resource_flavors"]),
    ("priority_class", lambda d: d["priority_classes"]),
    ("compute_profile", lambda d: d["compute_profiles"]),
    ("department", lambda d: d["departments"]),
    ("local_node", lambda d: d["local"]["nodes"]),
    ("cluster", lambda d: d["clusters"]),
)


def _quotas_flat(queue: dict[str, Any]) -> dict[str, Any]:
    """A ClusterQueue dump whose resource groups read as ``quota[flavor/resource]`` entries, so a changed quota
    is named by its flavor and resource rather than by list positions."""
    out = {k: v for k, v in queue.items() if k != "resource_groups"}
    for group in queue["resource_groups"]:
        for flavor in group["flavors"]:
            for r in flavor["resources"]:
                out[f"quota[{flavor['name']}/{r['name']}]"] = {k: v for k, v in r.items() if k != "name"}
    out["covered_resources"] = sorted({r for g in queue["resource_groups"] for r in g["covered_resources"]})
    return out


def diff(old: Platform, new: Platform) -> list[Change]:
    """What storing ``new`` over ``old`` changes, section by section: added, removed and changed entries."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    out: list[Change] = []
    for kind, read in _SECTIONS:
        before = {_key(e): e for e in read(a)}
        after = {_key(e): e for e in read(b)}
        out += [Change(kind, name, "add") for name in after if name not in before]
        out += [Change(kind, name, "remove") for name in before if name not in after]
        for name, entry in after.items():
            if name in before and before[name] != entry:
                out.append(Change(kind, name, "change", tuple(_fields(before[name], entry, ""))))
    if a["fair_sharing"] != b["fair_sharing"]:
        out.append(Change("fair_sharing", "policy", "change",
                          tuple(_fields(a["fair_sharing"], b["fair_sharing"], ""))))
    if a["dispatch"] != b["dispatch"]:
        out.append(Change("dispatch", "policy", "change", tuple(_fields(a["dispatch"], b["dispatch"], ""))))
    if a["wait_for_pods_ready"] != b["wait_for_pods_ready"]:
        out.append(Change("wait_for_pods_ready", "policy", "change",
                          tuple(_fields(a["wait_for_pods_ready"], b["wait_for_pods_ready"], ""))))
    if a["retention"] != b["retention"]:
        out.append(Change("retention", "policy", "change", tuple(_fields(a["retention"], b["retention"], ""))))
    return out


def retention_note(changes: list[Change]) -> str:
    """What applying a retention change does not do by itself (config/retention.py), or "" without one."""
    fields = [f for c in changes if c.kind == "retention" for f in c.details]
    notes = []
    if any(not f.startswith("evidence.") for f in fields):
        notes.append("existing streams keep their limits until `python -m taugrid.bus.bootstrap --update` "
                     "(the break-glass identity) applies retention.runs/logs/audit")
    if any(f.startswith("evidence.") for f in fields):
        notes.append("the evidence archive applies from the next seal; runs sealed before stay where they are")
    return "; ".join(notes)


def inert_here(p: Platform, backend: str) -> list[str]:
    """What ``p`` declares that a stack of ``backend`` stores but does not act on, each said with what happens
    instead ([] when nothing): accepted keys must not be silently ignored (docs §16). Kueue's controller
    Configuration (``fair_sharing``, ``wait_for_pods_ready``) on Kubernetes is said by ``render.kueue`` and
    ``render.kueueconfig``, which this layer may not import."""
    out = []
    if p.clusters and backend == "local":  # a dispatch other than the default is refused without clusters
        out.append("clusters/dispatch act from the next start of a local stack (`tau down`, `tau up`), which then "
                   "runs a hub, a leaf server and a simulated local cluster per cluster and the dispatcher; until "
                   "then a stack started without them sends every run to this stack's own backend, and one started "
                   "with them keeps the clusters and lease timing it started with, a cluster's quotas reaching its "
                   "site with this revision (docs §13d)")
    elif p.clusters:
        out.append("clusters/dispatch act on Kubernetes once the release's platform.config names them (helm upgrade): "
                   "the chart then runs the dispatcher and sends every run to it instead of this stack's own backend, "
                   "and each Kubernetes cluster's site (site.enabled) answers it through its kube-bridge, tested "
                   "against emulated Kubernetes only, not a real Kueue (docs §16 'Many clusters, what is left')")
    if backend == "local" and p.wait_for_pods_ready.recovery_timeout is not None:
        out.append("wait_for_pods_ready.recovery_timeout has nothing to time on the local cluster (a failed pod "
                   "fails its Job, so no workload waits for a replacement); it applies on Kubernetes, through "
                   "Kueue's controller Configuration (`tau platform render`)")
    return out


def _fields(old: Any, new: Any, path: str) -> Iterable[str]:
    """Each changed leaf as ``path: old → new``; lists of names as ``path: +added -removed``."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in [*new, *(k for k in old if k not in new)]:
            yield from _fields(old.get(k), new.get(k), f"{path}.{k}" if path else k)
    elif _named(old, new):
        before, after = {_key(e): e for e in old}, {_key(e): e for e in new}
        for name, entry in after.items():
            if name not in before:
                yield f"{path}[{name}] added"
            elif before[name] != entry:
                yield from _fields(before[name], entry, f"{path}[{name}]")
        yield from (f"{path}[{name}] removed" for name in before if name not in after)
    elif isinstance(old, list) and isinstance(new, list) and _scalars(old) and _scalars(new):
        if old != new:
            moved = [f"+{x}" for x in new if x not in old] + [f"-{x}" for x in old if x not in new]
            yield f"{path}: {' '.join(moved) or 'reordered'}"
    elif old != new:
        yield f"{path}: {_show(old)} → {_show(new)}"


def _named(old: Any, new: Any) -> bool:
    """Two lists of named entries (one may be empty), compared by name rather than by position."""
    if not (isinstance(old, list) and isinstance(new, list)) or not (old or new):
        return False
    return all(isinstance(e, dict) and "name" in e for e in [*old, *new])


def _scalars(values: list[Any]) -> bool:
    return all(not isinstance(v, (dict, list)) for v in values)


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)
