"""Port the data of Kueue's TAS unit-test tables into JSON (run by hand, not by pytest).

    python tests/admission/kueue/extract_tas.py <kueue git dir or checkout> [commit]

Reads ``pkg/cache/scheduler/tas_cache_test.go`` (TestFindTopologyAssignments) and
``pkg/scheduler/scheduler_tas_test.go`` (TestScheduleForTAS, TestScheduleForTASCohorts) with ``goliteral`` and
writes ``cases_tas_find.json`` / ``cases_tas_schedule.json`` beside this file: per case its Kueue test function
and case name, the nodes (labels, allocatable, readiness, taints), the non-TAS pods, the topology levels, the
pod sets with their topology requests, and Kueue's expectations (per pod set the topology assignment's levels
and (values, count) per domain, or the failure reason; for the scheduler, the admissions and what is left).
What the port does not model is recorded in ``unsupported`` so the runner lists the case with that reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from extract import (
    ENV,
    Unsupported,
    chain,
    cluster_queue,
    cohort,
    enum,
    file_helpers,
    guard,
    items,
    local_queue,
    number,
    queue_map,
    resolve,
    text,
    workload,
)
from goliteral import Call, Ident, Lit, Unary, assignments, parse_at

HERE = Path(__file__).parent
HOSTNAME = "kubernetes.io/hostname"
IDENTS = {"corev1.LabelHostname": HOSTNAME, "corev1.ResourceCPU": "cpu", "corev1.ResourceMemory": "memory",
          "corev1.ResourcePods": "pods", "corev1.EventTypeNormal": "Normal", "corev1.EventTypeWarning": "Warning"}
# Kueue feature gates whose default the port follows; enabling any other gate is out of the port's scope.
DEFAULT_ON = {"TASProfileMixed", "TASHandleOverlappingFlavors", "TopologyAwareScheduling",
              "TASRecomputeAssignmentWithinSchedulingCycle", "SkipReassignmentForPodOwnedWorkloads",
              "VectorizedResourceRequests", "TASCacheNodeMatchResults", "FlavorFungibility",
              "RecomputeAssignmentUponPreemptionTargetsOverlap"}
# Gates whose setting does not change what taugrid decides here: with SchedulerLibraryIntegration Kueue keeps
# cordoned and not-ready nodes in its cache but still leaves them out of TAS, which taugrid always does.
NO_EFFECT = {"SchedulerLibraryIntegration"}


def consts(src: str, func: str) -> dict[str, str]:
    """String constants of the test function (``tasBlockLabel = "cloud.com/topology-block"``)."""
    start = src.index(f"func {func}(")
    body = src[start:src.index("cases := ", start)]
    return dict(re.findall(r"^\s*(\w+)\s*=\s*\"([^\"]+)\"", body, re.M))


def s(v: Any) -> str:
    v = resolve(v)
    if isinstance(v, Ident) and v.name in IDENTS:
        return IDENTS[v.name]
    if isinstance(v, Ident) and v.name in CONSTS:
        return CONSTS[v.name]
    if isinstance(v, Ident) and v.name.endswith(".Name") and v.name[:-5] in ENV:  # defaultTASFlavor.Name
        return s(chain(ENV[v.name[:-5]])[1][0])
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name in ("new", "ptr.To") and v.args:
        return s(v.args[0])
    if isinstance(v, Call) and isinstance(v.func, Ident) and len(v.args) == 1:  # corev1.ResourceName("x")
        return s(v.args[0])
    return text(v)


CONSTS: dict[str, str] = {}


def strings(v: Any) -> list[str]:
    return [s(x) for x in items(v)]


def resource_list(v: Any) -> dict[str, str]:
    out = {}
    for k, q in resolve(v).items:
        q = resolve(q)
        if isinstance(q, Call) and isinstance(q.func, Ident) and q.func.name == "resource.MustParse":
            out[s(k)] = text(q.args[0])
        else:
            raise Unsupported(f"quantity {q!r}"[:80])
    return out


def taint(v: Any) -> dict[str, str]:
    lit = resolve(v)
    return {"key": s(lit.get("Key")), "value": s(lit.get("Value")) if lit.get("Value") is not None else "",
            "effect": enum(lit.get("Effect"))}


def node(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": s(args[0]), "labels": {}, "alloc": {}, "ready": True, "unschedulable": False,
                           "taints": []}
    for m, a in calls:
        if m == "Label":
            out["labels"][s(a[0])] = s(a[1])
        elif m == "StatusAllocatable":  # Kueue's builder merges into what is there
            out["alloc"].update(resource_list(a[0]))
        elif m == "Ready":
            out["ready"] = True
        elif m == "NotReady":
            out["ready"] = False
        elif m == "Unschedulable":
            out["unschedulable"] = True
        elif m == "Taints":
            out["taints"] += [taint(x) for x in a]
        elif m == "StatusConditions":
            # Readiness comes from Ready()/NotReady(); other conditions (NetworkUnavailable) do not count for TAS.
            if any(resolve(resolve(c).get("Type")) == Ident("corev1.NodeReady") for c in a):
                raise Unsupported("node Ready condition set by StatusConditions")
        elif m in ("Obj", "DeepCopy", "Clone"):
            continue
        else:
            raise Unsupported(f"node builder {m}")
    return out


def pod(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"node": "", "requests": {}, "phase": "Running"}
    for m, a in calls:
        if m == "NodeName":
            out["node"] = s(a[0])
        elif m == "Request":
            out["requests"][s(a[0])] = text(a[1])
        elif m == "StatusPhase":
            out["phase"] = resolve(a[0]).name.rpartition("Pod")[2]
        elif m in ("Obj", "Namespace", "Label", "Annotation"):
            continue
        else:
            raise Unsupported(f"pod builder {m}")
    return out


def topology_request(v: Any) -> dict[str, Any] | None:
    lit = resolve(v)
    if lit is None:
        return None
    out: dict[str, Any] = {}
    for k, val in lit.items:
        name = k.name
        if name == "Required":
            out["required"] = s(val)
        elif name == "Preferred":
            out["preferred"] = s(val)
        elif name == "Unconstrained":
            out["unconstrained"] = bool(resolve(resolve(val).args[0]) if isinstance(resolve(val), Call)
                                        else resolve(val))
        elif name == "PodSetSliceRequiredTopology":
            out["slice_required"] = s(val)
        elif name == "PodSetSliceSize":
            out["slice_size"] = int(number(val))
        elif name == "PodSetGroupName":
            out["pod_set_group"] = s(val)
        elif name == "PodsetSliceRequiredTopologyConstraints":
            raise Unsupported("multi-layer slice constraints (TASMultiLayerTopology)")
        else:
            raise Unsupported(f"topology request field {name}")
    return out


def want_assignment(v: Any) -> dict[str, Any] | None:
    lit = resolve(v)
    if lit is None:
        return None
    if not isinstance(lit, Lit):  # utiltestingapi.MakeTopologyAssignment(...).Domain(...).TopologyAssignment
        return topology_assignment(lit.base if hasattr(lit, "base") else lit)
    domains = []
    for d in items(lit.get("Domains")):
        d = resolve(d)
        domains.append([strings(d.get("Values")), int(number(d.get("Count")))])
    return {"levels": strings(lit.get("Levels")), "domains": domains}


def requests(v: Any) -> dict[str, float]:
    return {s(k): number(q) for k, q in resolve(v).items}


def toleration(v: Any) -> dict[str, str]:
    lit = resolve(v)
    return {"key": s(lit.get("Key")) if lit.get("Key") is not None else "",
            "operator": enum(lit.get("Operator")) if lit.get("Operator") is not None else "Equal",
            "value": s(lit.get("Value")) if lit.get("Value") is not None else "",
            "effect": enum(lit.get("Effect")) if lit.get("Effect") is not None else ""}


def find_pod_set(v: Any, uns: list[str]) -> dict[str, Any]:
    lit = resolve(v)
    out: dict[str, Any] = {"name": "main", "count": 1, "requests": {}, "request": None, "node_selector": {},
                           "tolerations": [], "want": None, "want_reason": "", "group": None}
    for k, val in lit.items:
        name = k.name
        if name == "podSetName":
            out["name"] = s(val)
        elif name == "count":
            out["count"] = int(number(val))
        elif name == "requests":
            out["requests"] = requests(val)
        elif name == "topologyRequest":
            out["request"] = guard(topology_request, val, uns)
        elif name == "nodeSelector":
            out["node_selector"] = {s(a): s(b) for a, b in resolve(val).items}
        elif name == "tolerations":
            out["tolerations"] = [toleration(x) for x in items(val)]
        elif name == "wantAssignment":
            out["want"] = want_assignment(val)
        elif name == "wantReason":
            out["want_reason"] = s(val)
        elif name == "podSetGroupName":
            out["group"] = s(val)
        elif name == "previousAssignment":
            uns.append("elastic workload slices (previousAssignment)")
        elif name == "nodeAffinity":
            uns.append("pod node affinity (nodeAffinity)")
        else:
            uns.append(f"pod set field {name}")
    return out


def gates(v: Any, uns: list[str]) -> dict[str, bool]:
    out = {}
    for k, val in resolve(v).items:
        name = k.name.rpartition(".")[2]
        on = bool(resolve(val))
        out[name] = on
        if name in NO_EFFECT:
            continue
        if name in DEFAULT_ON and not on:
            uns.append(f"feature gate {name} off (taugrid follows its default, on)")
        elif name not in DEFAULT_ON and on:
            uns.append(f"feature gate {name} on (taugrid follows its default, off)")
    return out


def find_cases(src: str, func: str = "TestFindTopologyAssignments") -> list[dict[str, Any]]:
    ENV.clear()
    CONSTS.clear()
    CONSTS.update(consts(src, func))
    ENV.update(assignments(src, func))
    start = src.index(f"func {func}(")
    table = parse_at(src[start:], "cases := ")
    out = []
    for key, case in table.items:
        uns: list[str] = []
        rec: dict[str, Any] = {"test": func, "case": key}
        rec["nodes"] = guard(lambda v: [node(x) for x in items(v)], case.get("nodes"), uns) or []
        rec["pods"] = (guard(lambda v: [pod(x) for x in items(v)], case.get("pods"), uns) or []
                       if case.get("pods") is not None else [])
        rec["levels"] = strings(case.get("levels"))
        rec["node_labels"] = ({s(a): s(b) for a, b in resolve(case.get("nodeLabels")).items}
                              if case.get("nodeLabels") is not None else {})
        rec["pod_sets"] = [find_pod_set(x, uns) for x in items(case.get("podSets"))]
        rec["feature_gates"] = gates(case.get("featureGates"), uns) if case.get("featureGates") is not None else {}
        for name in ("workload", "priorFlavorUsage", "priorOwnUsage"):
            if case.get(name) is not None:
                uns.append({"workload": "node replacement for a workload with unhealthy nodes (workload)",
                            "priorFlavorUsage": "usage of another flavor sharing the nodes (priorFlavorUsage)",
                            "priorOwnUsage": "usage recorded by domain, not by workload (priorOwnUsage)"}[name])
        rec["unsupported"] = sorted(set(uns))
        out.append(rec)
    return out


# -- TestScheduleForTAS / TestScheduleForTASCohorts -------------------------------------------------------

def topology_obj(v: Any) -> dict[str, Any]:
    v = resolve(v)
    if isinstance(v, Unary):
        v = v.value
    ctor, args, calls = chain(v)
    if ctor.endswith("MakeDefaultOneLevelTopology"):
        return {"name": s(args[0]), "levels": [HOSTNAME]}
    if ctor.endswith("MakeDefaultTwoLevelTopology"):
        return {"name": s(args[0]), "levels": ["cloud.com/topology-block", HOSTNAME]}
    if ctor.endswith("MakeDefaultThreeLevelTopology"):
        return {"name": s(args[0]), "levels": ["cloud.com/topology-block", "cloud.com/topology-rack", HOSTNAME]}
    out: dict[str, Any] = {"name": s(args[0]), "levels": []}
    for m, a in calls:
        if m == "Levels":
            out["levels"] = [s(x) for x in a]
        elif m != "Obj":
            raise Unsupported(f"topology builder {m}")
    return out


def tas_flavor(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": s(args[0]), "labels": {}, "taints": [], "topology": None}
    for m, a in calls:
        if m == "NodeLabel":
            out["labels"][s(a[0])] = s(a[1])
        elif m == "TopologyName":
            out["topology"] = s(a[0])
        elif m == "Taint":
            out["taints"].append(taint(a[0]))
        elif m == "Toleration":
            raise Unsupported("ResourceFlavor tolerations")
        elif m != "Obj":
            raise Unsupported(f"flavor builder {m}")
    return out


def tas_pod_set(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": s(args[0]), "count": int(number(args[1])), "requests": {}, "request": None,
                           "node_selector": {}, "tolerations": []}
    req: dict[str, Any] = {}
    for m, a in calls:
        if m == "Request":
            out["requests"][s(a[0])] = text(a[1])
        elif m == "RequiredTopologyRequest":
            req["required"] = s(a[0])
        elif m == "PreferredTopologyRequest":
            req["preferred"] = s(a[0])
        elif m == "UnconstrainedTopologyRequest" or m == "UnconstrainedTopology":
            req["unconstrained"] = True
        elif m == "SliceRequiredTopologyRequest":
            req["slice_required"] = s(a[0])
        elif m == "SliceSizeTopologyRequest":
            req["slice_size"] = int(number(a[0]))
        elif m == "NodeSelector":
            out["node_selector"].update({s(k): s(x) for k, x in resolve(a[0]).items})
        elif m == "Toleration":
            from extract import toleration as tol
            out["tolerations"].append(tol(a[0]))
        elif m == "PodSetGroup":
            req["pod_set_group"] = s(a[0])
        elif m == "Obj":
            continue
        else:
            raise Unsupported(f"pod set builder {m}")
    if req:
        out["request"] = req
    return out


def schedule_workload(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": s(args[0]), "queue": "", "priority": 0, "pod_sets": [], "admission": None,
                           "created": 0.0}
    for m, a in calls:
        if m == "Queue":
            out["queue"] = s(a[0])
        elif m == "Priority":
            out["priority"] = int(number(a[0]))
        elif m == "PodSets":
            out["pod_sets"] = [tas_pod_set(x) for x in a]
        elif m in ("ReserveQuotaAt", "ReserveQuota", "ReserveQuotaAtWithIndex"):
            out["admission"] = tas_admission(a[0])
        elif m in ("Obj", "AdmittedAt", "Admitted", "Creation", "Label", "UID", "JobUID", "ResourceVersion",
                   "Generation", "Condition", "Active"):
            continue
        else:
            raise Unsupported(f"workload builder {m}")
    return out


def tas_admission(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"cq": s(args[0]), "pod_sets": []}
    for m, a in calls:
        if m == "PodSets":
            for x in a:
                _, pargs, pcalls = chain(x)
                ps: dict[str, Any] = {"name": s(pargs[0]), "flavors": {}, "usage": {}, "count": None,
                                      "topology": None}
                for pm, pa in pcalls:
                    if pm == "Assignment":
                        ps["flavors"][s(pa[0])] = s(pa[1])
                        ps["usage"][s(pa[0])] = text(pa[2])
                    elif pm == "Count":
                        ps["count"] = int(number(pa[0]))
                    elif pm == "TopologyAssignment":
                        ps["topology"] = topology_assignment(pa[0])
                    elif pm != "Obj":
                        raise Unsupported(f"pod set assignment builder {pm}")
                out["pod_sets"].append(ps)
        elif m != "Obj":
            raise Unsupported(f"admission builder {m}")
    return out


def topology_assignment(v: Any) -> dict[str, Any] | None:
    v = resolve(v)
    if v is None:
        return None
    ctor, args, calls = chain(v)
    levels_v = resolve(args[0])
    if isinstance(levels_v, Call) and isinstance(levels_v.func, Ident) and levels_v.func.name == "utiltas.Levels":
        levels = topology_obj(levels_v.args[0])["levels"]
    else:
        levels = strings(levels_v)
    domains = []

    def domain(d: Any) -> list[Any]:
        d = resolve(d)
        if isinstance(d, Lit):
            return [strings(d.get("Values")), int(number(d.get("Count")))]
        _, dargs, _ = chain(d)
        return [strings(dargs[0]), int(number(dargs[1]))]

    for m, a in calls:
        if m == "Domain":
            domains.append(domain(a[0]))
        elif m == "Domains":
            domains.extend(domain(d) for d in a)
        elif m != "Obj":
            raise Unsupported(f"topology assignment builder {m}")
    return {"levels": levels, "domains": domains}


def want_new_assignments(v: Any) -> dict[str, Any]:
    return {s(k).rpartition("/")[2]: tas_admission(x) for k, x in resolve(v).items}


def want_events(v: Any) -> dict[str, str]:
    """Per workload, the message of its Warning event (the pending reason) when the case names one."""
    out = {}
    for e in items(v):
        ctor, args, calls = chain(e)
        if len(args) < 4 or s(args[3]) != "Warning":
            continue
        msg = next((text(a[0]) for m, a in calls if m == "Message"), None)
        if msg is not None:
            out[s(args[1])] = msg
    return out


def schedule_cases(src: str, func: str) -> list[dict[str, Any]]:
    ENV.clear()
    ENV.update(file_helpers(src))
    CONSTS.clear()
    CONSTS.update(consts(src, func))
    ENV.update(assignments(src, func))
    start = src.index(f"func {func}(")
    table = parse_at(src[start:], "cases := ")
    base_lqs = guard(lambda v: [local_queue(x) for x in items(v)], ENV.get("queues"), []) or []
    out = []
    for key, case in table.items:
        uns: list[str] = []
        rec: dict[str, Any] = {"test": func, "case": key}
        rec["nodes"] = guard(lambda v: [node(x) for x in items(v)], case.get("nodes"), uns) or []
        rec["pods"] = (guard(lambda v: [pod(x) for x in items(v)], case.get("pods"), uns) or []
                       if case.get("pods") is not None else [])
        rec["topologies"] = guard(lambda v: [topology_obj(x) for x in items(v)], case.get("topologies"), uns) or []
        rec["flavors"] = guard(lambda v: [tas_flavor(x) for x in items(v)], case.get("resourceFlavors"), uns) or []
        cqs = guard(lambda v: [cluster_queue(x) for x in items(v)], case.get("clusterQueues"), uns) or []
        for cq in cqs:
            uns.extend(cq.pop("unsupported"))
        rec["cluster_queues"] = cqs
        rec["cohorts"] = (guard(lambda v: [cohort(x) for x in items(v)], case.get("cohorts"), uns) or []
                          if case.get("cohorts") is not None else [])
        for c in rec["cohorts"]:
            uns.extend(c.pop("unsupported"))
        rec["local_queues"] = base_lqs
        rec["workloads"] = guard(lambda v: [schedule_workload(x) for x in items(v)], case.get("workloads"),
                                 uns) or []
        rec["want_assignments"] = (guard(want_new_assignments, case.get("wantNewAssignments"), uns) or {}
                                   if case.get("wantNewAssignments") is not None else {})
        rec["want_left"] = guard(queue_map, case.get("wantLeft"), uns) if case.get("wantLeft") is not None else {}
        rec["want_inadmissible"] = (guard(queue_map, case.get("wantInadmissibleLeft"), uns)
                                    if case.get("wantInadmissibleLeft") is not None else {})
        rec["want_messages"] = (guard(want_events, case.get("wantEvents"), uns) or {}
                                if case.get("wantEvents") is not None else {})
        victims = None
        if case.get("wantWorkloads") is not None:
            victims = {}
            for w in guard(lambda v: [workload(x) for x in items(v)], case.get("wantWorkloads"), uns) or []:
                for c in w["conditions"]:
                    if c["type"] == "Preempted" and c["status"] == "True":
                        victims[w["name"]] = c["reason"]
        rec["want_victims"] = victims
        rec["feature_gates"] = gates(case.get("featureGates"), uns) if case.get("featureGates") is not None else {}
        for name in ("admissionChecks", "resourceTransformations", "patchStatusErr"):
            if case.get(name) is not None:
                uns.append(f"case field {name} (admission checks, resource transformations, API errors)")
        rec["unsupported"] = sorted(set(uns))
        out.append(rec)
    return out


def main() -> None:
    repo = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else "HEAD"

    def show(path: str) -> str:
        return subprocess.run(["git", f"--git-dir={repo}", "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout

    sha = subprocess.run(["git", f"--git-dir={repo}", "rev-parse", commit], check=True, capture_output=True,
                         text=True).stdout.strip()
    find = find_cases(show("pkg/cache/scheduler/tas_cache_test.go"))
    src = show("pkg/scheduler/scheduler_tas_test.go")
    sched = [c for fn in ("TestScheduleForTAS", "TestScheduleForTASPreemption", "TestScheduleForTASCohorts")
             for c in schedule_cases(src, fn)]
    for name, cases in (("cases_tas_find.json", find), ("cases_tas_schedule.json", sched)):
        (HERE / name).write_text(json.dumps({"kueue_commit": sha, "cases": cases}, indent=1) + "\n")
        print(name, len(cases), "cases,", sum(1 for c in cases if not c["unsupported"]), "without unsupported parts")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
