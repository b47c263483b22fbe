"""Port the data of Kueue's scheduler/preemption unit-test tables into JSON (run by hand, not by pytest).

    python tests/admission/kueue/extract.py <kueue git dir or checkout> [commit]

Reads ``pkg/scheduler/preemption/preemption_test.go`` (TestPreemption) and ``pkg/scheduler/scheduler_test.go``
(TestSchedule) with ``goliteral`` and writes ``cases_preemption.json`` / ``cases_schedule.json`` beside this file:
per case its Kueue test function and case name, ClusterQueues, Cohorts, flavors, the admitted workloads with
their flavor assignment, the incoming/pending workloads, and Kueue's expectations (victims with reasons,
admissions with flavors, what is left). Builder calls the port does not model are recorded in ``unsupported``
so the test runner can list the case as out of scope with that reason instead of guessing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from goliteral import (
    Binary,
    Call,
    FuncLit,
    GoSyntax,
    Ident,
    Lit,
    Opaque,
    Parser,
    Sel,
    Unary,
    assignments,
    parse_at,
)

HERE = Path(__file__).parent

# Builder methods that carry no scheduling meaning for the port (names, labels, bookkeeping).
IGNORED = {
    "Obj", "Clone", "UID", "JobUID", "Label", "Labels", "Annotations", "Annotation", "Generation", "ResourceVersion",
    "NamespaceSelector", "Finalizers", "SchedulingStatsEviction", "Namespace", "ControllerReference",
    "PriorityClass", "PriorityClassSource", "PriorityClassRef", "Image", "Active",
    "AdmittedAt", "ResourceGroupBuilder", "OwnerReference",
    "ResourceRequests", "PastAdmittedTime", "ReclaimablePods",
}


class Unsupported(Exception):
    pass


def chain(v: Any) -> tuple[str, list[Any], list[tuple[str, list[Any]]]]:
    """``a.Make(x).B(y).C()`` -> ("a.Make", [x], [("B", [y]), ("C", [])])."""
    calls: list[tuple[str, list[Any]]] = []
    while True:
        if isinstance(v, Unary):
            v = v.value
        elif isinstance(v, Call) and isinstance(v.func, Sel):
            calls.append((v.func.name, v.args))
            v = v.func.base
        elif isinstance(v, Call) and isinstance(v.func, Ident):
            name = v.func.name
            head, _, last = name.rpartition(".")
            if head and last[0].isupper() and not last.startswith("Make") and head in ENV:
                calls.append((last, v.args))  # method on a variable: baseWl.Clone().Priority(1)
                v = ENV[head]
                continue
            return name, v.args, list(reversed(calls))
        elif isinstance(v, Ident) and v.name in ENV:
            v = ENV[v.name]
        elif isinstance(v, Sel) and v.name in ("Workload", "ClusterQueue", "Cohort"):
            v = v.base  # the wrapper's embedded object, same as .Obj()
        else:
            raise Unsupported(f"not a builder chain: {v!r}"[:120])


ENV: dict[str, Any] = {}


def resolve(v: Any) -> Any:
    while True:
        if isinstance(v, Ident) and v.name in ENV:
            v = ENV[v.name]
        elif isinstance(v, Call) and isinstance(v.func, FuncLit) and not v.args:
            ENV.update(v.func.assigns)  # its locals, resolved right away by the case being converted
            v = v.func.result
        elif (isinstance(v, Call) and isinstance(v.func, Ident) and not v.args
              and isinstance(ENV.get(v.func.name), FuncLit)):  # a file-level helper: defaultCohorts()
            v = Call(ENV[v.func.name], [])
        else:
            break
    if isinstance(v, Unary) and v.op in "&*":
        return resolve(v.value)
    return v


def seconds(v: Any) -> float | None:
    """A Go time expression relative to the test's ``now`` (0); the zero time is None (oldest possible)."""
    v = resolve(v) if not (isinstance(v, Ident) and v.name == "now") else v
    if isinstance(v, Ident) and v.name == "now":
        return 0.0
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name in ("now.Add",):
        return 0.0 + duration(v.args[0])
    if isinstance(v, Call) and isinstance(v.func, Sel) and v.func.name == "Add":
        base = seconds(v.func.base)
        return None if base is None else base + duration(v.args[0])
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "metav1.NewTime":
        return seconds(v.args[0])
    if isinstance(v, Lit) and v.type.endswith("Time"):
        return None
    raise Unsupported(f"time expression {v!r}"[:120])


UNITS = {"time.Second": 1.0, "time.Millisecond": 0.001, "time.Minute": 60.0, "time.Hour": 3600.0,
         "time.Nanosecond": 1e-9, "time.Microsecond": 1e-6}


def duration(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v) * 1e-9
    if isinstance(v, Ident) and v.name in UNITS:
        return UNITS[v.name]
    if isinstance(v, Unary) and v.op == "-":
        return -duration(v.value)
    if isinstance(v, Binary) and v.op == "*":
        left = v.left if not isinstance(v.left, Call) else v.left.args[0]
        right = v.right if not isinstance(v.right, Call) else v.right.args[0]
        try:
            return number(left) * duration(right)
        except Unsupported:
            return duration(left) * number(right)
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "time.Duration":
        return duration(v.args[0])
    raise Unsupported(f"duration {v!r}"[:120])


def resource_name(v: Any) -> str:
    v = resolve(v)
    if isinstance(v, str):
        return v
    if isinstance(v, Ident):
        return {"corev1.ResourceCPU": "cpu", "corev1.ResourceMemory": "memory", "corev1.ResourcePods": "pods",
                "resourceGPU": "example.com/gpu"}.get(v.name) or _unsupported(f"resource {v.name}")
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "corev1.ResourceName":
        return resource_name(v.args[0])
    raise Unsupported(f"resource {v!r}"[:80])


def _unsupported(msg: str) -> str:
    raise Unsupported(msg)


def text(v: Any) -> str:
    v = resolve(v)
    if isinstance(v, str):
        return v
    if isinstance(v, Call) and len(v.args) == 1:  # kueue.ClusterQueueReference("x")
        return text(v.args[0])
    if isinstance(v, Ident):
        consts = {"kueue.DefaultPodSetName": "main"}
        if v.name in consts:
            return consts[v.name]
    raise Unsupported(f"string {v!r}"[:80])


def enum(v: Any) -> str:
    v = resolve(v)
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name in ("new", "ptr.To") and v.args:
        return enum(v.args[0])
    if isinstance(v, Ident):
        table = {
            "kueue.PreemptionPolicyNever": "Never", "kueue.PreemptionPolicyLowerPriority": "LowerPriority",
            "kueue.PreemptionPolicyLowerOrNewerEqualPriority": "LowerOrNewerEqualPriority",
            "kueue.PreemptionPolicyAny": "Any", "kueue.BorrowWithinCohortPolicyNever": "Never",
            "kueue.BorrowWithinCohortPolicyLowerPriority": "LowerPriority", "kueue.StrictFIFO": "StrictFIFO",
            "kueue.BestEffortFIFO": "BestEffortFIFO", "kueue.Borrow": "Borrow", "kueue.TryNextFlavor": "TryNextFlavor",
            "kueue.Preempt": "Preempt", "kueue.MayStopSearch": "MayStopSearch",
            "kueue.PreferNoBorrowing": "PreferNoBorrowing", "kueue.PreferBorrowing": "PreferBorrowing",
            "corev1.TaintEffectNoSchedule": "NoSchedule", "corev1.TaintEffectNoExecute": "NoExecute",
            "corev1.TaintEffectPreferNoSchedule": "PreferNoSchedule",
            "corev1.TolerationOpEqual": "Equal", "corev1.TolerationOpExists": "Exists",
            "kueue.BorrowingOverPreemption": "BorrowingOverPreemption",
            "kueue.PreemptionOverBorrowing": "PreemptionOverBorrowing",
        }
        if v.name in table:
            return table[v.name]
    if isinstance(v, str):
        return v
    raise Unsupported(f"enum {v!r}"[:80])


CONSTANTS = {"utiltesting.Ki": 2**10, "utiltesting.Mi": 2**20, "utiltesting.Gi": 2**30, "utiltesting.Ti": 2**40,
             "math.MaxInt64": 2**63 - 1, "math.MaxInt32": 2**31 - 1}


def number(v: Any) -> float:
    v = resolve(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, Ident) and v.name in CONSTANTS:
        return float(CONSTANTS[v.name])
    if isinstance(v, Binary):
        a, b = number(v.left), number(v.right)
        return {"*": a * b, "+": a + b, "-": a - b, "/": a / b}[v.op]
    if isinstance(v, Unary) and v.op == "-":
        return -number(v.value)
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name in ("new", "ptr.To", "int32", "int64"):
        return number(v.args[0])
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name.startswith("ptr.To"):
        return number(v.args[0])
    raise Unsupported(f"number {v!r}"[:80])


# -- objects -------------------------------------------------------------------------------------------

def flavor_quotas(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    if not ctor.endswith("MakeFlavorQuotas"):
        raise Unsupported(f"flavor quotas {ctor}")
    out: dict[str, Any] = {"name": text(args[0]), "resources": {}}
    current: list[Any] = []
    for m, a in calls:
        if m == "Resource":
            vals = [text(x) for x in a[1:]]
            vals += [""] * (3 - len(vals))
            out["resources"][resource_name(a[0])] = [vals[0], vals[1] or None, vals[2] or None]
        elif m == "ResourceQuotaWrapper":
            current = ["0", None, None]
            out["resources"][resource_name(a[0])] = current
        elif m in ("NominalQuota", "BorrowingLimit", "LendingLimit"):
            current[("NominalQuota", "BorrowingLimit", "LendingLimit").index(m)] = text(a[0])
        elif m in ("Append", "FlavorQuotas") or m in IGNORED:
            continue
        else:
            raise Unsupported(f"FlavorQuotas.{m}")
    return out


def preemption(v: Any) -> dict[str, Any]:
    lit = resolve(v)
    out: dict[str, Any] = {"within": "Never", "reclaim": "Never", "bwc": None}
    for k, val in lit.items:
        key = k.name if isinstance(k, Ident) else k
        if key == "WithinClusterQueue":
            out["within"] = enum(val)
        elif key == "ReclaimWithinCohort":
            out["reclaim"] = enum(val)
        elif key == "BorrowWithinCohort":
            b = resolve(val)
            pol = b.get("Policy")
            thr = b.get("MaxPriorityThreshold")
            out["bwc"] = {"policy": enum(pol) if pol is not None else "Never",
                          "threshold": None if thr is None else int(number(thr))}
        else:
            raise Unsupported(f"Preemption.{key}")
    return out


def resource_groups_of(calls: list[tuple[str, list[Any]]], unsupported: list[str]) -> list[list[dict[str, Any]]]:
    groups = []
    for m, a in calls:
        if m == "ResourceGroup":
            groups.append([flavor_quotas(x) for x in a])
    return groups


def cluster_queue(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    if not ctor.endswith("MakeClusterQueue"):
        raise Unsupported(f"cluster queue {ctor}")
    out: dict[str, Any] = {"name": text(args[0]), "cohort": None, "strategy": "BestEffortFIFO",
                           "preemption": {"within": "Never", "reclaim": "Never", "bwc": None},
                           "groups": [], "fair_weight": 1.0, "fungibility": None, "unsupported": [],
                           "namespace_selector": {}}
    for m, a in calls:
        if m == "Cohort":
            out["cohort"] = text(a[0])
        elif m == "QueueingStrategy":
            out["strategy"] = enum(a[0])
        elif m == "Preemption":
            out["preemption"] = preemption(a[0])
        elif m == "ResourceGroup":
            out["groups"].append([flavor_quotas(x) for x in a])
        elif m == "FairWeight":
            out["fair_weight"] = quantity_number(a[0])
        elif m == "FlavorFungibility":
            lit = resolve(a[0])
            out["fungibility"] = {
                "when_can_borrow": enum(lit.get("WhenCanBorrow")) if lit.get("WhenCanBorrow") is not None else None,
                "when_can_preempt": enum(lit.get("WhenCanPreempt")) if lit.get("WhenCanPreempt") is not None else None,
                "preference": enum(lit.get("Preference")) if lit.get("Preference") is not None else None}
        elif m == "NamespaceSelector":
            out["namespace_selector"] = label_selector(a[0])
        elif m in IGNORED:
            continue
        else:
            out["unsupported"].append(f"ClusterQueue.{m}")
    return out


def label_selector(v: Any) -> dict[str, list[str]] | None:
    """matchExpressions with operator In, as key -> allowed values (None = every namespace)."""
    lit = resolve(v)
    if lit is None:
        return None
    out: dict[str, list[str]] = {}
    for k, val in resolve(lit.get("MatchLabels", Lit(""))).items:
        out[text(k)] = [text(val)]
    for expr in items(lit.get("MatchExpressions")) if lit.get("MatchExpressions") is not None else []:
        expr = resolve(expr)
        if not (isinstance(expr.get("Operator"), Ident) and expr.get("Operator").name.endswith("OpIn")):
            raise Unsupported("namespaceSelector operator")
        out[text(expr.get("Key"))] = [text(x) for x in items(expr.get("Values"))]
    return out


def quantity_number(v: Any) -> float:
    v = resolve(v)
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "resource.MustParse":
        return float(text(v.args[0]))
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name.startswith("ptr.To"):
        return quantity_number(v.args[0])
    return number(v)


def cohort(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": text(args[0]), "parent": None, "groups": [], "fair_weight": 1.0,
                           "unsupported": []}
    for m, a in calls:
        if m == "Parent":
            out["parent"] = text(a[0])
        elif m == "ResourceGroup":
            out["groups"].append([flavor_quotas(x) for x in a])
        elif m == "FairWeight":
            out["fair_weight"] = quantity_number(a[0])
        elif m in IGNORED:
            continue
        else:
            out["unsupported"].append(f"Cohort.{m}")
    return out


def flavor(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": text(args[0]), "labels": {}, "taints": [], "unsupported": []}
    for m, a in calls:
        if m == "NodeLabel":
            out["labels"][text(a[0])] = text(a[1])
        elif m == "Taint":
            t = resolve(a[0])
            out["taints"].append({"key": text(t.get("Key")), "value": text(t.get("Value", "")),
                                  "effect": enum(t.get("Effect"))})
        elif m in IGNORED:
            continue
        else:
            out["unsupported"].append(f"ResourceFlavor.{m}")
    return out


def pod_set(v: Any, unsupported: list[str]) -> dict[str, Any]:
    v = resolve(v)
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"name": text(args[0]), "count": int(number(args[1])), "requests": {},
                           "node_selector": {}, "tolerations": []}
    for m, a in calls:
        if m == "Request":
            out["requests"][resource_name(a[0])] = text(a[1])
        elif m == "NodeSelector":
            out["node_selector"].update({text(k): text(val) for k, val in resolve(a[0]).items})
        elif m == "Toleration":
            out["tolerations"].append(toleration(a[0]))
        elif m == "Containers":
            for c in a:
                c = resolve(c)
                if not (isinstance(c, Call) and isinstance(c.func, Ident)
                        and c.func.name == "utiltesting.SingleContainerForRequest"):
                    raise Unsupported("PodSet.Containers")
                for r, q in resolve(c.args[0]).items:
                    out["requests"][resource_name(r)] = text(q)
        elif m in IGNORED:
            continue
        else:
            unsupported.append(f"PodSet.{m}")
    return out


def toleration(v: Any) -> dict[str, str]:
    t = resolve(v)
    return {"key": text(t.get("Key", "")), "operator": enum(t.get("Operator", "Equal")),
            "value": text(t.get("Value", "")), "effect": enum(t.get("Effect", "")) if t.get("Effect") else ""}


def admission(v: Any, unsupported: list[str]) -> dict[str, Any]:
    v = resolve(v)
    if isinstance(v, Lit):
        return {"cq": text(v.get("ClusterQueue")),
                "pod_sets": [pod_set_assignment(x, unsupported) for x in items(v.get("PodSetAssignments"))]}
    ctor, args, calls = chain(v)
    out: dict[str, Any] = {"cq": text(args[0]), "pod_sets": []}
    for m, a in calls:
        if m == "PodSets":
            out["pod_sets"].extend(pod_set_assignment(ps, unsupported) for ps in a)
        elif m in IGNORED:
            continue
        elif m == "PodSetAssignments" or m == "AssignmentWithIndex":
            unsupported.append(f"Admission.{m}")
        else:
            unsupported.append(f"Admission.{m}")
    return out


def pod_set_assignment(v: Any, unsupported: list[str]) -> dict[str, Any]:
    v = resolve(v)
    if isinstance(v, Lit):
        cnt = v.get("Count")
        usage = resolve(v.get("ResourceUsage")) if v.get("ResourceUsage") is not None else Lit("")
        return {"name": text(v.get("Name")), "count": None if cnt is None else int(number(cnt)),
                "flavors": {resource_name(k): text(f) for k, f in resolve(v.get("Flavors")).items},
                "usage": {resource_name(k): _must_parse(q) for k, q in usage.items}}
    pctor, pargs, pcalls = chain(v)
    psa: dict[str, Any] = {"name": text(pargs[0]), "flavors": {}, "usage": {}, "count": None}
    for pm, pa in pcalls:
        if pm == "Assignment":
            res = resource_name(pa[0])
            psa["flavors"][res] = text(pa[1])
            psa["usage"][res] = text(pa[2])
        elif pm == "Count":
            psa["count"] = int(number(pa[0]))
        elif pm in IGNORED:
            continue
        else:
            unsupported.append(f"PodSetAssignment.{pm}")
    return psa


def _must_parse(v: Any) -> str:
    v = resolve(v)
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "resource.MustParse":
        return text(v.args[0])
    return text(v)


def workload(v: Any) -> dict[str, Any]:
    ctor, args, calls = chain(v)
    if not ctor.endswith("MakeWorkload"):
        raise Unsupported(f"workload {ctor}")
    ns = text(args[1]) if len(args) > 1 else ""
    out: dict[str, Any] = {"name": text(args[0]), "namespace": ns, "priority": 0, "queue": "", "created": None,
                           "pod_sets": [{"name": "main", "count": 1, "requests": {}, "node_selector": {},
                                         "tolerations": []}],
                           "admission": None, "reserved_at": None, "admitted": False, "conditions": [],
                           "unsupported": []}
    uns = out["unsupported"]
    for m, a in calls:
        if m == "Priority":
            out["priority"] = int(number(a[0]))
        elif m == "Name":
            out["name"] = text(a[0])
        elif m == "Request":
            out["pod_sets"][0]["requests"][resource_name(a[0])] = text(a[1])
        elif m == "Queue":
            out["queue"] = text(a[0])
        elif m == "Creation":
            out["created"] = seconds(a[0])
        elif m == "PodSets":
            out["pod_sets"] = [pod_set(x, uns) for x in a]
        elif m == "ReserveQuotaAt":
            out["admission"] = admission(a[0], uns)
            out["reserved_at"] = seconds(a[1])
        elif m == "SimpleReserveQuota":  # every request of the single pod set in one flavor
            ps0 = out["pod_sets"][0]
            out["admission"] = {"cq": text(a[0]), "pod_sets": [{
                "name": ps0["name"], "count": ps0["count"], "flavors": {r: text(a[1]) for r in ps0["requests"]},
                "usage": {r: f"{ps0['count']}*{v}" for r, v in ps0["requests"].items()}}]}
            out["reserved_at"] = seconds(a[2])
        elif m == "ReserveQuota" or m == "Admission":
            out["admission"] = admission(a[0], uns)
        elif m == "Admitted" or m in ("AdmittedAt",):
            out["admitted"] = bool(resolve(a[0]))
        elif m == "Condition":
            c = resolve(a[0])
            cond = {"type": _cond_type(c.get("Type")), "status": _cond_status(c.get("Status")),
                    "reason": _reason(c.get("Reason")),
                    "at": seconds(c.get("LastTransitionTime")) if c.get("LastTransitionTime") is not None else None}
            out["conditions"].append(cond)
        elif m == "NodeSelector":
            out["pod_sets"][0]["node_selector"].update({text(k): text(val) for k, val in resolve(a[0]).items})
        elif m == "Toleration":
            out["pod_sets"][0]["tolerations"].append(toleration(a[0]))
        elif m in IGNORED:
            continue
        else:
            uns.append(f"Workload.{m}")
    return out


def _reason(v: Any) -> str:
    v = resolve(v)
    if v is None:
        return ""
    if isinstance(v, Ident):
        name = v.name.rpartition(".")[2]
        for prefix in ("WorkloadQuotaReservedReason", "Workload"):
            name = name.removeprefix(prefix)
        return name.removesuffix("Reason")
    return text(v)


def _cond_type(v: Any) -> str:
    v = resolve(v)
    if isinstance(v, Ident):
        return v.name.removeprefix("kueue.Workload")
    return str(v)


def _cond_status(v: Any) -> str:
    v = resolve(v)
    return "True" if isinstance(v, Ident) and v.name.endswith("True") else "False"


def items(v: Any) -> list[Any]:
    v = resolve(v)
    if isinstance(v, Call) and isinstance(v.func, Opaque):
        raise Unsupported("workloads built by Go code (a loop), not a literal table")
    if isinstance(v, Lit):
        return [x for _, x in v.items]
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "append":
        out = []
        for a in v.args:
            out.extend(items(a))
        return out
    raise Unsupported(f"list {v!r}"[:80])


def guard(fn: Any, v: Any, unsupported: list[str]) -> Any:
    try:
        return fn(v)
    except Unsupported as e:
        unsupported.append(str(e))
        return None


# -- TestPreemption ------------------------------------------------------------------------------------

def preemption_cases(src: str, func: str = "TestPreemption") -> list[dict[str, Any]]:
    ENV.clear()
    ENV.update(assignments(src, func))
    flavors = ([flavor(x) for x in items(ENV["flavors"])] if "flavors" in ENV
               else [{"name": "default", "labels": {}, "taints": [], "unsupported": []}])
    start = src.index(f"func {func}(")
    table = parse_at(src[start:], "cases := ")
    out = []
    for key, case in table.items:
        uns: list[str] = []
        rec: dict[str, Any] = {"test": func, "case": key, "flavors": flavors}
        cqs = guard(lambda v: [cluster_queue(x) for x in items(v)], case.get("clusterQueues"), uns) or []
        rec["cluster_queues"] = cqs
        rec["cohorts"] = guard(lambda v: [cohort(x) for x in items(v)], case.get("cohorts"), uns) or [] \
            if case.get("cohorts") is not None else []
        rec["admitted"] = guard(lambda v: [workload(x) for x in items(v)], case.get("admitted"), uns) or [] \
            if case.get("admitted") is not None else []
        rec["incoming"] = guard(workload, case.get("incoming"), uns)
        rec["target_cq"] = guard(text, case.get("targetCQ"), uns)
        rec["assignment"] = guard(assignment_modes, case.get("assignment"), uns)
        want = case.get("wantPreempted")
        rec["want_preempted_count"] = int(number(want)) if want is not None else 0
        victims: dict[str, str] = {}
        for w in (guard(lambda v: [workload(x) for x in items(v)], case.get("wantWorkloads"), uns) or []
                  if case.get("wantWorkloads") is not None else []):
            for c in w["conditions"]:
                if c["type"] == "Preempted" and c["status"] == "True":
                    victims[w["name"]] = c["reason"]
        rec["want_victims"] = victims
        for k, _ in case.items:
            name = k.name if isinstance(k, Ident) else k
            if name not in ("clusterQueues", "cohorts", "admitted", "incoming", "targetCQ", "assignment",
                            "wantPreempted", "wantWorkloads"):
                uns.append(f"case field {name}")
        for cq in cqs:
            uns.extend(cq.pop("unsupported"))
        for c in rec["cohorts"] or []:
            uns.extend(c.pop("unsupported"))
        for w in (rec["admitted"] or []) + ([rec["incoming"]] if rec["incoming"] else []):
            uns.extend(w.pop("unsupported"))
        rec["unsupported"] = sorted(set(uns))
        out.append(rec)
    return out


def assignment_modes(v: Any) -> list[dict[str, list[str]]]:
    """Kueue's given assignment: per pod set, resource -> [flavor, mode]."""
    v = resolve(v)
    if isinstance(v, Call) and isinstance(v.func, Ident) and v.func.name == "singlePodSetAssignment":
        return [_resource_assignment(v.args[0])]
    if isinstance(v, Lit):
        out = []
        for ps in items(v.get("PodSets")):
            out.append(_resource_assignment(ps.get("Flavors")))
        return out
    raise Unsupported(f"assignment {v!r}"[:80])


def _resource_assignment(v: Any) -> dict[str, list[str]]:
    v = resolve(v)
    out = {}
    for k, fa in v.items:
        fa = resolve(fa)
        mode = fa.get("Mode")
        out[resource_name(k)] = [text(fa.get("Name")), mode.name.rpartition(".")[2] if isinstance(mode, Ident) else ""]
    return out


# -- TestSchedule --------------------------------------------------------------------------------------

def file_helpers(src: str) -> dict[str, Any]:
    """The file's zero-argument helper functions that only assign and return (``func defaultCohorts() ...``)."""
    out: dict[str, Any] = {}
    for m in re.finditer(r"^func (\w+)\(\) [^{]*\{", src, re.M):
        p = Parser(src, m.end() - 1)
        try:
            out[m.group(1)] = p.func_body()
        except GoSyntax:
            continue
    return out


def schedule_cases(src: str, func: str = "TestSchedule") -> list[dict[str, Any]]:
    ENV.clear()
    ENV.update(file_helpers(src))
    ENV.update(assignments(src, func))
    flavors = [flavor(x) for x in items(ENV["resourceFlavors"])]
    base_cqs = [cluster_queue(x) for x in items(ENV["clusterQueues"])]
    base_lqs = [local_queue(x) for x in items(ENV["queues"])]
    start = src.index(f"func {func}(")
    table = parse_at(src[start:], "cases := map[string]scheduleTestCase")
    out = []
    for key, case in table.items:
        uns: list[str] = []
        rec: dict[str, Any] = {"test": func, "case": key, "flavors": flavors}
        extra_cqs = guard(lambda v: [cluster_queue(x) for x in items(v)], case.get("additionalClusterQueues"),
                          uns) if case.get("additionalClusterQueues") is not None else []
        extra_lqs = guard(lambda v: [local_queue(x) for x in items(v)], case.get("additionalLocalQueues"),
                          uns) if case.get("additionalLocalQueues") is not None else []
        rec["cluster_queues"] = [dict(c, unsupported=list(c["unsupported"])) for c in base_cqs] + (extra_cqs or [])
        rec["local_queues"] = base_lqs + (extra_lqs or [])
        rec["cohorts"] = (guard(lambda v: [cohort(x) for x in items(v)], case.get("cohorts"), uns) or []
                          if case.get("cohorts") is not None else [])
        rec["workloads"] = (guard(lambda v: [workload(x) for x in items(v)], case.get("workloads"), uns) or []
                            if case.get("workloads") is not None else [])
        rec["fair_sharing"] = bool(resolve(case.get("enableFairSharing", False)))
        wa = case.get("wantAssignments")
        rec["want_assignments"] = guard(want_assignments, wa, uns) if wa is not None else {}
        rec["want_left"] = guard(queue_map, case.get("wantLeft"), uns) if case.get("wantLeft") is not None else {}
        rec["want_inadmissible"] = (guard(queue_map, case.get("wantInadmissibleLeft"), uns)
                                    if case.get("wantInadmissibleLeft") is not None else {})
        victims: dict[str, str] = {}
        for field_name in ("wantWorkloads",):
            if case.get(field_name) is None:
                continue
            for w in guard(lambda v: [workload(x) for x in items(v)], case.get(field_name), uns) or []:
                for c in w["conditions"]:
                    if c["type"] == "Preempted" and c["status"] == "True":
                        victims[w["name"]] = c["reason"]
                uns.extend(x for x in w.pop("unsupported") if not x.startswith("Workload.Condition"))
        rec["want_victims"] = victims if case.get("wantWorkloads") is not None else None
        for k, _ in case.items:
            name = k.name if isinstance(k, Ident) else k
            if name == "featureGates":
                rec["feature_gates"] = {k.name.rpartition(".")[2]: bool(resolve(val))
                                        for k, val in resolve(case.get("featureGates")).items}
            elif name in ("objects", "admissionError", "wantSkippedPreemptions",
                          "wantPreemptionTargetRecomputations") and name in ("objects", "admissionError"):
                uns.append(f"case field {name}")
        for cq in rec["cluster_queues"]:
            cq_uns = cq.pop("unsupported")
            if any(cq["name"] == w["admission"]["cq"] for w in rec["workloads"] if w.get("admission")) or \
                    any(lq["cq"] == cq["name"] for lq in rec["local_queues"]
                        if any(w["queue"] == lq["name"] for w in rec["workloads"])):
                uns.extend(cq_uns)
        for c in rec["cohorts"]:
            uns.extend(c.pop("unsupported"))
        for w in rec["workloads"]:
            uns.extend(w.pop("unsupported"))
        rec["unsupported"] = sorted(set(uns))
        out.append(rec)
    return out


def local_queue(v: Any) -> dict[str, str]:
    ctor, args, calls = chain(v)
    out = {"name": text(args[0]), "namespace": text(args[1]), "cq": ""}
    for m, a in calls:
        if m == "ClusterQueue":
            out["cq"] = text(a[0])
    return out


def want_assignments(v: Any) -> dict[str, Any]:
    lit = resolve(v)
    out = {}
    for k, adm in lit.items:
        out[text(k)] = admission(adm, [])
    return out


def queue_map(v: Any) -> dict[str, list[str]]:
    lit = resolve(v)
    out = {}
    for k, lst in lit.items:
        out[text(k)] = [text(x) for x in items(lst)] if isinstance(resolve(lst), Lit) else []
    return out


# -- TestAssignFlavors ---------------------------------------------------------------------------------

def flavor_cases(src: str, func: str = "TestAssignFlavors") -> list[dict[str, Any]]:
    ENV.clear()
    ENV.update(assignments(src, func))
    flavors = [flavor(x) for x in items(ENV["resourceFlavors"])]
    start = src.index(f"func {func}(")
    table = parse_at(src[start:], "cases := ")
    out = []
    known = {"wlPods", "clusterQueue", "clusterQueueUsage", "secondaryClusterQueue", "secondaryClusterQueueUsage",
             "wantRepMode", "wantAssignment", "enableFairSharing", "simulationResult"}
    for key, case in table.items:
        uns: list[str] = []
        rec: dict[str, Any] = {"test": func, "case": key, "flavors": flavors}
        rec["pod_sets"] = guard(lambda v, u=uns: [pod_set(x, u) for x in items(v)], case.get("wlPods"), uns) or []
        cqs = [guard(cluster_queue, case.get("clusterQueue"), uns)]
        if case.get("secondaryClusterQueue") is not None:
            cqs.append(guard(cluster_queue, case.get("secondaryClusterQueue"), uns))
        rec["cluster_queues"] = [c for c in cqs if c is not None]
        rec["usage"] = guard(fr_amounts, case.get("clusterQueueUsage"), uns) or []
        rec["secondary_usage"] = guard(fr_amounts, case.get("secondaryClusterQueueUsage"), uns) or []
        rec["fair_sharing"] = bool(resolve(case.get("enableFairSharing", False)))
        rec["simulation"] = guard(simulation, case.get("simulationResult"), uns) or []
        rep = resolve(case.get("wantRepMode"))
        rec["want_mode"] = rep.name if isinstance(rep, Ident) else "NoFit"
        rec["want"] = guard(want_flavor_assignment, case.get("wantAssignment"), uns)
        for k, _ in case.items:
            name = k.name if isinstance(k, Ident) else k
            if name not in known:
                uns.append(f"case field {name}")
        for c in rec["cluster_queues"]:
            uns.extend(c.pop("unsupported"))
        used = {fq["name"] for c in rec["cluster_queues"] for g in c["groups"] for fq in g}
        for f in flavors:
            if f["name"] in used:
                uns.extend(f["unsupported"])
        rec["unsupported"] = sorted(set(uns))
        out.append(rec)
    for f in flavors:
        f.pop("unsupported", None)
    return out


def fr_amounts(v: Any) -> list[list[Any]]:
    """FlavorResourceQuantities as [flavor, resource, amount in Kueue's int64 units (cpu in millis)]."""
    lit = resolve(v)
    out: list[list[Any]] = []
    if lit is None:
        return out
    for k, amount in lit.items:
        k = resolve(k)
        amount = resolve(amount)
        if isinstance(amount, Call) and isinstance(amount.func, Ident) and amount.func.name == "resources.NewAmount":
            amount = amount.args[0]
        out.append([text(k.get("Flavor")), resource_name(k.get("Resource")), number(amount)])
    return out


def simulation(v: Any) -> list[list[Any]]:
    lit = resolve(v)
    out: list[list[Any]] = []
    if lit is None:
        return out
    for k, res in lit.items:
        k, res = resolve(k), resolve(res)
        vals = [x for _, x in res.items]
        out.append([text(k.get("Flavor")), resource_name(k.get("Resource")), vals[0].name.rpartition(".")[2],
                    int(number(vals[1]))])
    return out


def want_flavor_assignment(v: Any) -> dict[str, Any]:
    lit = resolve(v)
    out: dict[str, Any] = {"borrowing": int(number(lit.get("Borrowing", 0))), "pod_sets": []}
    for ps in items(lit.get("PodSets")) if lit.get("PodSets") is not None else []:
        ps = resolve(ps)
        flv = {}
        for r, fa in (resolve(ps.get("Flavors")).items if ps.get("Flavors") is not None else []):
            fa = resolve(fa)
            mode = fa.get("Mode")
            flv[resource_name(r)] = [text(fa.get("Name")), mode.name if isinstance(mode, Ident) else "Fit"]
        out["pod_sets"].append({"name": text(ps.get("Name")), "flavors": flv,
                                "count": int(number(ps.get("Count", 0)))})
    return out


# -- TestFairPreemptions --------------------------------------------------------------------------------

def fair_cases(src: str, func: str = "TestFairPreemptions") -> list[dict[str, Any]]:
    ENV.clear()
    ENV.update(assignments(src, func))
    base_flavors = [flavor(x) for x in items(ENV["flavors"])]
    start = src.index(f"func {func}(")
    table = parse_at(src[start:], "cases := ")
    out = []
    known = {"clusterQueues", "cohorts", "flavors", "assignmentFlavor", "strategies", "admitted", "incoming",
             "targetCQ", "wantPreempted"}
    for key, case in table.items:
        uns: list[str] = []
        rec: dict[str, Any] = {"test": func, "case": key}
        rec["flavors"] = (guard(lambda v: [flavor(x) for x in items(v)], case.get("flavors"), uns)
                          if case.get("flavors") is not None else base_flavors) or []
        rec["cluster_queues"] = guard(lambda v: [cluster_queue(x) for x in items(v)], case.get("clusterQueues"),
                                      uns) or []
        rec["cohorts"] = (guard(lambda v: [cohort(x) for x in items(v)], case.get("cohorts"), uns) or []
                          if case.get("cohorts") is not None else [])
        rec["admitted"] = guard(lambda v: [workload(x) for x in items(v)], case.get("admitted"), uns) or []
        rec["incoming"] = guard(workload, case.get("incoming"), uns)
        if rec["incoming"] is not None:
            rec["incoming"]["admission"] = None  # the incoming workload is pending; Kueue's test ignores it
        rec["target_cq"] = guard(text, case.get("targetCQ"), uns)
        af = case.get("assignmentFlavor")
        rec["assignment_flavor"] = text(af) if af is not None else "default"
        st = case.get("strategies")
        rec["strategies"] = ([resolve(x).name.rpartition(".")[2] for x in items(st)] if st is not None
                             else ["LessThanOrEqualToFinalShare", "LessThanInitialShare"])
        want: dict[str, str] = {}
        wp = resolve(case.get("wantPreempted"))
        if isinstance(wp, Call):
            for arg in wp.args:
                arg = resolve(arg)
                want[text(arg.args[0]).lstrip("/")] = _reason(arg.args[1])
        rec["want_victims"] = want
        for k, _ in case.items:
            name = k.name if isinstance(k, Ident) else k
            if name not in known:
                uns.append(f"case field {name}")
        for c in rec["cluster_queues"]:
            uns.extend(c.pop("unsupported"))
        for c in rec["cohorts"]:
            uns.extend(c.pop("unsupported"))
        for w in rec["admitted"] + ([rec["incoming"]] if rec["incoming"] else []):
            uns.extend(w.pop("unsupported"))
        rec["unsupported"] = sorted(set(uns))
        out.append(rec)
    return out


def main() -> None:
    repo, commit = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "HEAD")

    def show(path: str) -> str:
        return subprocess.run(["git", f"--git-dir={repo}", "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout

    sha = subprocess.run(["git", f"--git-dir={repo}", "rev-parse", commit], check=True, capture_output=True,
                         text=True).stdout.strip()
    pre = preemption_cases(show("pkg/scheduler/preemption/preemption_test.go"))
    pre += preemption_cases(show("pkg/scheduler/preemption/preemption_hierarchical_test.go"),
                            "TestHierarchicalPreemptions")
    sch = schedule_cases(show("pkg/scheduler/scheduler_test.go"))
    sch += schedule_cases(show("pkg/scheduler/scheduler_fs_test.go"), "TestScheduleForFairSharing")
    sch += schedule_cases(show("pkg/scheduler/scheduler_recompute_preemption_test.go"),
                          "TestScheduleRecomputePreemptionTargets")
    fla = flavor_cases(show("pkg/scheduler/flavorassigner/flavorassigner_test.go"))
    fair = fair_cases(show("pkg/scheduler/preemption/preemption_fair_test.go"))
    for name, cases in (("preemption", pre), ("schedule", sch), ("flavors", fla), ("fair_preemption", fair)):
        doc = {"source": f"kubernetes-sigs/kueue@{sha}", "cases": cases}
        (HERE / f"cases_{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(name, len(cases), "cases,", sum(1 for c in cases if not c["unsupported"]), "without unsupported")


if __name__ == "__main__":
    main()
