"""Cross-reference checks of a ``Platform``: every name it mentions must exist, every quota must parse (the
topologies and what uses them: ``platformtopology``).

Invariant: ``check_platform`` never raises; it returns every problem at once, each naming the field path
(``workspaces[1].local_queue``), its line when known, and the fix — usually the list of names that do exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from taugrid.config.clusters import check_clusters
from taugrid.config.departments import DEPARTMENTS_ROOT, KAI_RESOURCES, KaiQueueFields
from taugrid.config.platform import GPU_RESOURCE, Platform, ResourceQuota, amount
from taugrid.config.platformdevices import check_devices
from taugrid.config.platformtopology import check_topologies
from taugrid.config.source import Lines, make_issue, suggest
from taugrid.core.devices import is_gpu_resource
from taugrid.core.identity import is_user_public_key

Issues = list[dict[str, object]]
Add = Callable[..., None]


def check_platform(platform: Platform, *, file: str = "platform.yaml", lines: Lines | None = None) -> Issues:
    issues: Issues = []
    known_lines = lines or {}

    def add(path: tuple[str | int, ...], message: str, fix: str = "") -> None:
        issues.append(make_issue(path, message, fix, file=file, lines=known_lines))

    for section in (
        "topologies",
        "resource_flavors",
        "cohorts",
        "cluster_queues",
        "priority_classes",
        "compute_profiles",
        "workspaces",
    ):
        _unique(add, section, [item.name for item in getattr(platform, section)])
    _unique(add, "local_queues", [f"{q.namespace}/{q.name}" for q in platform.local_queues])
    _unique(add, "users", [u.name for u in platform.users])
    _unique(add, "groups", [g.name for g in platform.groups])
    _cohorts(platform, add)
    _departments(platform, add)
    _cluster_queues(platform, add)
    _local_queues(platform, add)
    _profiles(platform, add)
    check_devices(platform, add)
    _workspaces(platform, add)
    _people(platform, add)
    check_topologies(platform, add)
    check_clusters(platform.clusters, [q.name for q in platform.all_cluster_queues()], add, platform.dispatch,
                   {q.name: {f.name: {r.name: r.lending_limit for r in f.resources}
                             for g in q.resource_groups for f in g.flavors} for q in platform.cluster_queues})
    return issues


def _unique(add: Add, section: str, names: list[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            add((section, i, "name"), f"duplicate name {name!r}", "give each entry a distinct name")
        seen.add(name)


def _missing(add: Add, path: tuple[str | int, ...], kind: str, name: str, known: Iterable[str]) -> None:
    """An unknown name: the message names the nearest valid one (even a distant one), the fix lists them all."""
    options = sorted(set(known))
    guess = nearest(name, options)
    add(
        path,
        f"unknown {kind} {name!r}" + (f"; did you mean '{guess}'?" if guess else f"; no {kind} is defined"),
        f"use one of: {', '.join(options)}" if options else f"define the {kind} first",
    )


def nearest(word: str, options: list[str]) -> str | None:
    """The closest option by difflib's ratio (a close match first; ties go to the first in sorted order)."""
    if not options:
        return None
    close = suggest(word, options)
    if close is not None:
        return close
    import difflib  # here: every service checks its platform when it reads one, only a mistake needs a guess

    ratios = [difflib.SequenceMatcher(None, word.lower(), o.lower()).ratio() for o in options]
    return options[ratios.index(max(ratios))]


def _cohorts(platform: Platform, add: Add) -> None:
    names = {c.name for c in platform.cohorts}
    parents = {c.name: c.parent for c in platform.cohorts}
    for i, cohort in enumerate(platform.cohorts):
        if cohort.parent is not None and cohort.parent not in names:
            _missing(add, ("cohorts", i, "parent"), "cohort", cohort.parent, names)
        seen, node = {cohort.name}, cohort.parent
        while node is not None and node in parents:
            if node in seen:
                add(
                    ("cohorts", i, "parent"),
                    f"cohort {cohort.name!r} is part of a parent cycle",
                    "cohorts form a tree; remove one parent link",
                )
                break
            seen.add(node)
            node = parents[node]


def _departments(platform: Platform, add: Add) -> None:
    """Names that clash with cohorts or queues, the flavor, the resources, and limit >= deserved."""
    taken = {c.name: "cohort" for c in platform.cohorts} | {q.name: "cluster queue" for q in platform.cluster_queues}
    taken.setdefault(DEPARTMENTS_ROOT, "the implicit root cohort of all departments")
    if platform.departments and DEPARTMENTS_ROOT in {c.name for c in platform.cohorts}:
        i = next(i for i, c in enumerate(platform.cohorts) if c.name == DEPARTMENTS_ROOT)
        add(("cohorts", i, "name"), f"{DEPARTMENTS_ROOT!r} is the implicit root cohort of the departments",
            "rename this cohort")
    flavors = {f.name for f in platform.resource_flavors}
    for i, dept in enumerate(platform.departments):
        base: tuple[str | int, ...] = ("departments", i)
        if dept.flavor is not None and dept.flavor not in flavors:
            _missing(add, (*base, "flavor"), "resource flavor", dept.flavor, flavors)
        elif dept.flavor is None and len(flavors) != 1:
            add((*base, "name"), f"department {dept.name!r} names no flavor and the platform declares "
                f"{len(flavors)}", "set flavor: to one of the resource_flavors" if flavors
                else "declare a resource flavor (resource_flavors: [{name: default}])")
        named: list[tuple[tuple[str | int, ...], str, str]] = [((*base, "name"), dept.name, "department")]
        named += [((*base, "projects", j, "name"), p.name, "project") for j, p in enumerate(dept.projects)]
        for path, name, kind in named:
            if name in taken:
                add(path, f"{kind} {name!r} has the name of {taken[name]}" if taken[name].startswith("the")
                    else f"{kind} {name!r} has the name of a {taken[name]}", "give it a name of its own")
            taken[name] = kind
        _kai_resources(add, base, dept)
        for j, project in enumerate(dept.projects):
            _kai_resources(add, (*base, "projects", j), project)


def _kai_resources(add: Add, base: tuple[str | int, ...], queue: KaiQueueFields) -> None:
    values: dict[str, dict[str, float]] = {"deserved": {}, "limit": {}}
    for key in ("deserved", "limit"):
        for resource, raw in getattr(queue, key).items():
            path = (*base, key, resource)
            if resource not in KAI_RESOURCES:
                if is_gpu_resource(resource):  # another vendor's GPUs: a reason, not a typo
                    add(path, f"KAI queue resource {resource!r} is not taken: a KAI Queue has one gpu resource, "
                              f"which KAI fills from nvidia.com/gpu and amd.com/gpu alike and never from "
                              f"habana.ai/gaudi, while taugrid's local KAI model counts each by its name",
                        f"give departments {GPU_RESOURCE} quota, or give {resource} runs a cluster queue of "
                        "their own (resource_flavors with its gpu_model)")
                elif resource.lower().rstrip("s") in ("gpu", "nvidia.com/gpu"):  # "gpu" reads closer to "cpu"
                    add(path, f"unknown KAI queue resource {resource!r}; did you mean '{GPU_RESOURCE}'?",
                        f"use one of: {', '.join(KAI_RESOURCES)}")
                else:
                    _missing(add, path, "KAI queue resource", resource, KAI_RESOURCES)
                continue
            try:
                values[key][resource] = amount(resource, raw)
            except ValueError as exc:
                add(path, str(exc), "write a quantity such as 16, 500m or 64Gi")
                continue
            if resource == GPU_RESOURCE and values[key][resource] != int(values[key][resource]):
                add(path, f"GPUs are whole devices, got {raw!r}", "use a whole number")
    for resource, limit in values["limit"].items():
        if limit < values["deserved"].get(resource, 0.0):
            add((*base, "limit", resource), f"limit {limit:g} is below the deserved quota "
                f"{values['deserved'][resource]:g}", "raise the limit to at least the deserved quota")


def _cluster_queues(platform: Platform, add: Add) -> None:
    cohorts = {c.name for c in platform.all_cohorts()}
    flavors = {f.name for f in platform.resource_flavors}
    for i, cq in enumerate(platform.cluster_queues):
        base: tuple[str | int, ...] = ("cluster_queues", i)
        if cq.cohort is not None and cq.cohort not in cohorts:
            _missing(add, (*base, "cohort"), "cohort", cq.cohort, cohorts)
        covered_anywhere: set[str] = set()
        flavors_anywhere: set[str] = set()
        for g, group in enumerate(cq.resource_groups):
            gpath = (*base, "resource_groups", g)
            covered = set(group.covered_resources)
            for resource in covered & covered_anywhere:
                add(
                    (*gpath, "covered_resources"),
                    f"{resource!r} is covered by two resource groups",
                    "list each resource in one group only",
                )
            covered_anywhere |= covered
            for f, fq in enumerate(group.flavors):
                fpath = (*gpath, "flavors", f)
                if fq.name not in flavors:
                    _missing(add, (*fpath, "name"), "resource flavor", fq.name, flavors)
                if fq.name in flavors_anywhere:
                    add((*fpath, "name"), f"flavor {fq.name!r} appears in two resource groups", "use it once")
                flavors_anywhere.add(fq.name)
                listed = [q.name for q in fq.resources]
                if set(listed) != covered or len(listed) != len(set(listed)):
                    add(
                        (*fpath, "resources"),
                        f"lists {sorted(listed)} but the group covers {sorted(covered)}",
                        "give every covered resource exactly one quota entry per flavor",
                    )
                for r, quota in enumerate(fq.resources):
                    _quota(add, (*fpath, "resources", r), quota, has_cohort=cq.cohort is not None)


def _quota(add: Add, path: tuple[str | int, ...], quota: ResourceQuota, *, has_cohort: bool) -> None:
    values: dict[str, float] = {}
    for key in ("nominal_quota", "borrowing_limit", "lending_limit"):
        raw = getattr(quota, key)
        if raw is None:
            continue
        try:
            values[key] = amount(quota.name, raw)
        except ValueError as exc:
            add((*path, key), str(exc), "write a quantity such as 16, 500m or 64Gi")
            continue
        if is_gpu_resource(quota.name) and values[key] != int(values[key]):
            add((*path, key), f"GPUs are whole devices, got {raw!r}", "use a whole number")
    if not has_cohort:
        for key in ("borrowing_limit", "lending_limit"):
            if getattr(quota, key) is not None:
                add(
                    (*path, key), "only meaningful for a ClusterQueue in a cohort", "set cohort, or remove it"
                )
    if (
        "lending_limit" in values
        and "nominal_quota" in values
        and values["lending_limit"] > values["nominal_quota"]
    ):
        add((*path, "lending_limit"), "exceeds the nominal quota", "lend at most the nominal quota")


def _local_queues(platform: Platform, add: Add) -> None:
    cqs = {q.name for q in platform.all_cluster_queues()}
    for i, lq in enumerate(platform.local_queues):
        if lq.cluster_queue not in cqs:
            _missing(add, ("local_queues", i, "cluster_queue"), "cluster queue", lq.cluster_queue, cqs)


def _profiles(platform: Platform, add: Add) -> None:
    for i, profile in enumerate(platform.compute_profiles):
        share = profile.gpu_fraction is not None or profile.gpu_memory is not None
        if share and profile.gpu > 0:
            add(
                ("compute_profiles", i, "gpu"),
                "a GPU share (gpu_fraction/gpu_memory) is part of one GPU",
                "set gpu: 0 for a shared-GPU profile",
            )
        if profile.gpu_fraction is not None and profile.gpu_memory is not None:
            add(
                ("compute_profiles", i, "gpu_memory"),
                "set either gpu_fraction or gpu_memory, not both",
                "remove one",
            )


def _workspaces(platform: Platform, add: Add) -> None:
    profiles = {p.name for p in platform.compute_profiles}
    priorities = {p.name for p in platform.priority_classes}
    for i, ws in enumerate(platform.workspaces):
        base: tuple[str | int, ...] = ("workspaces", i)
        if platform.local_queue(ws.local_queue, ws.namespace) is None:
            in_ns = [q.name for q in platform.local_queues if q.namespace == ws.namespace]
            if in_ns:
                _missing(
                    add,
                    (*base, "local_queue"),
                    f"local queue in namespace {ws.namespace!r}",
                    ws.local_queue,
                    in_ns,
                )
            else:
                elsewhere = sorted({q.namespace for q in platform.local_queues if q.name == ws.local_queue})
                add(
                    (*base, "local_queue"),
                    f"no local queue {ws.local_queue!r} in namespace {ws.namespace!r}"
                    + (f" (it exists in namespace {', '.join(map(repr, elsewhere))})" if elsewhere else ""),
                    f"add a local_queues entry with namespace: {ws.namespace}"
                    + (f", or set namespace: {elsewhere[0]}" if elsewhere else ""),
                )
        if ws.default_priority is not None and ws.default_priority not in priorities:
            _missing(add, (*base, "default_priority"), "priority class", ws.default_priority, priorities)
        for p, name in enumerate(ws.allowed_profiles):
            if name not in profiles:
                _missing(add, (*base, "allowed_profiles", p), "compute profile", name, profiles)
        if ws.default_profile is not None:
            if ws.default_profile not in profiles:
                _missing(add, (*base, "default_profile"), "compute profile", ws.default_profile, profiles)
            elif ws.allowed_profiles and ws.default_profile not in ws.allowed_profiles:
                add(
                    (*base, "default_profile"),
                    f"{ws.default_profile!r} is not in allowed_profiles",
                    "add it to allowed_profiles or pick an allowed one",
                )
            else:
                profile = platform.profile(ws.default_profile)
                if profile and ws.max_gpus_per_run is not None and profile.gpu > ws.max_gpus_per_run:
                    add(
                        (*base, "default_profile"),
                        f"asks for {profile.gpu} GPUs but max_gpus_per_run is {ws.max_gpus_per_run}",
                        "pick a smaller default profile or raise the limit",
                    )
        if not ws.output_root.startswith("/"):
            add((*base, "output_root"), f"{ws.output_root!r} is not an absolute path", "use an absolute path")


def _people(platform: Platform, add: Add) -> None:
    """Users' keys and groups, and every workspace's members, admins and priority classes."""
    users = {u.name for u in platform.users}
    groups = {g.name for g in platform.groups}
    keys: dict[str, str] = {}
    for i, user in enumerate(platform.users):
        if not is_user_public_key(user.nkey):
            add(("users", i, "nkey"), f"{user.nkey[:12]!r}… is not a public user nkey",
                "paste the public key printed by `tau admin user add` (56 characters starting with U)")
        elif user.nkey in keys:
            add(("users", i, "nkey"), f"the same key as user {keys[user.nkey]!r}", "give each person their own key")
        keys.setdefault(user.nkey, user.name)
        if user.name in groups:
            add(("users", i, "name"), f"{user.name!r} is also a group name", "rename the user or the group")
        for g, group in enumerate(user.groups):
            if group not in groups:
                _missing(add, ("users", i, "groups", g), "group", group, groups)
    priorities = {p.name for p in platform.priority_classes}
    for i, ws in enumerate(platform.workspaces):
        for key in ("members", "admins"):
            for m, name in enumerate(getattr(ws, key)):
                if name in users or name in groups:
                    continue
                if not platform.users:
                    add(("workspaces", i, key, m), f"{name!r} names a person but the platform has no users",
                        "declare users (tau admin user add NAME) or remove the member list")
                else:
                    _missing(add, ("workspaces", i, key, m), "user or group", name, users | groups)
        for p, name in enumerate(ws.allowed_priority_classes):
            if name not in priorities:
                _missing(add, ("workspaces", i, "allowed_priority_classes", p), "priority class", name, priorities)
        if (ws.default_priority is not None and ws.allowed_priority_classes
                and ws.default_priority not in ws.allowed_priority_classes):
            add(("workspaces", i, "default_priority"), f"{ws.default_priority!r} is not in allowed_priority_classes",
                "add it to allowed_priority_classes or pick an allowed one")
