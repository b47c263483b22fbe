"""The TAS pass of flavor assignment: a quota assignment is kept only if its TAS flavors' topologies hold it.

Role: Kueue's ``assignFlavors`` tail. After quota picked a flavor per pod set, every pod set on a TAS flavor
needs a topology assignment (``placement.Cluster.tas_assign``). With the quota fitting and the topology not
holding the pods now, Kueue turns the assignment into *Preempt* when the topology would hold them with every
admitted workload gone (victims may free the domains), else *NoFit*; with the quota needing preemption it
asks only the all-gone question. Either way the pending message is Kueue's ``couldn't assign flavors to pod set
<name>: topology "<t>" doesn't allow to fit any of <n> pod(s)``.

taugrid then goes on to the next flavor of the ClusterQueue in the same cycle (Kueue gets there in a later
cycle through its last-tried-flavor memory): the failed (pod set, flavor) is excluded and quota assignment runs
again. The first failure is what stays pending when no other flavor holds the workload, and a flavor that could
preempt is kept when ``whenCanPreempt: MayStopSearch`` says so.

Invariant: an assignment returned in mode FIT carries a topology assignment for each TAS pod set
(``Assignment.topology``) that fits the nodes as they are now.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from . import results as R
from .model import ResourceFlavor, WhenCanPreempt, Workload
from .nominate import Assignment, Mode
from .placement import Cluster, TasFailure

Renominate = Callable[[Mapping[tuple[str, str], str]], Assignment]


def _uses_tas(a: Assignment, flavors: Mapping[str, ResourceFlavor]) -> bool:
    return any(flavors.get(f) is not None and flavors[f].topology_name is not None
               for p in a.pod_sets for f in p.flavors.values())


def _all_tas_preempt(a: Assignment, flavors: Mapping[str, ResourceFlavor]) -> None:
    """Kueue ``updateModeForTASRequests(Preempt)``: every resource of every TAS pod set may need preemption
    (the quota may fit in total but the free capacity be fragmented over the domains)."""
    for p in a.pod_sets:
        if any(flavors.get(f) is not None and flavors[f].topology_name is not None for f in p.flavors.values()):
            for r in p.flavors:
                p.modes[r] = Mode.PREEMPT


def _failed(a: Assignment, failure: TasFailure, flavors: Mapping[str, ResourceFlavor], *, preempt: bool
            ) -> Assignment:
    a.message = R.msg_couldnt_assign(failure.pod_set, [failure.reason])
    if preempt:
        a.mode = Mode.PREEMPT
        a.reason = R.WAITING_FOR_QUOTA
        _all_tas_preempt(a, flavors)
    else:
        a.mode = Mode.NO_FIT
        a.reason = R.TOPOLOGY_PLACEMENT_FAILED
    return a


def with_topology(a: Assignment, *, workload: Workload, cluster: Cluster | None,
                  flavors: Mapping[str, ResourceFlavor], when_can_preempt: WhenCanPreempt,
                  renominate: Renominate) -> Assignment:
    """Check (and if need be redo) a quota assignment against the TAS topologies; see the module docstring."""
    excluded: dict[tuple[str, str], str] = {}
    first: Assignment | None = None
    while a.mode != Mode.NO_FIT and _uses_tas(a, flavors):
        per_pod_set = [p.flavors for p in a.pod_sets]
        if cluster is None:
            name = next(p.name for p in a.pod_sets
                        if any(flavors[f].topology_name for f in p.flavors.values() if f in flavors))
            return _failed(a, TasFailure(name, "", "topology aware scheduling needs nodes; give the engine its "
                                                   "nodes"), flavors, preempt=False)
        found = cluster.tas_assign(workload, per_pod_set, flavors, empty=a.mode == Mode.PREEMPT)
        if not isinstance(found, TasFailure):
            if a.mode == Mode.FIT:
                a.topology = found[1]
            else:
                _all_tas_preempt(a, flavors)
            return a
        preempt = a.mode == Mode.FIT and not isinstance(
            cluster.tas_assign(workload, per_pod_set, flavors, empty=True), TasFailure)
        failed = _failed(a, found, flavors, preempt=preempt)
        if first is None:
            first = failed
        if preempt and when_can_preempt == WhenCanPreempt.MAY_STOP_SEARCH:
            return failed
        excluded[(found.pod_set, found.flavor)] = found.reason
        a = renominate(excluded)
    if first is not None and a.mode == Mode.NO_FIT:
        return first
    return a
