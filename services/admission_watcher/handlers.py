"""Watch events → run events (``translate``: queued, admitted, running, finished; ``progress``: the pod-level
phases, ``exec.progress``). Idempotent: translation is a pure function of the object, each output has a
deterministic message id, and events for stale attempts or finished runs are dropped (``runs.RunGate``: the
run_state record is read only on doubt).

A real Kueue Workload resolves to its run only through its job's uid (see ``owners``: memory, then the
``bridge`` KV bucket). When one of our Workloads arrives before any replica has recorded its Job/RayJob, the
event is retried (``TemporaryError``, 0.5 s) until the owner lands; after ``max_tries`` deliveries seen here
it goes to the DLQ with a message naming the Workload and the job uid it waited for. (Spread over replicas,
the server's max-deliveries advisory may land in the DLQ first.)
"""

from __future__ import annotations

from collections import OrderedDict

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.topology import CONSUMERS
from taugrid.core.contracts import WatchEvent
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.publishing import SOURCE_PREFIX
from taugrid.kube.progress import progress
from taugrid.kube.translate import RunRef, awaits_owner, owner_uids, translate, uids_to_resolve
from taugrid_services.admission_watcher.owners import Owners
from taugrid_services.admission_watcher.runs import RunGate

OWNER_WAIT_S = 0.5
LOCAL_CLUSTER_SOURCE = f"{SOURCE_PREFIX}local-cluster"
_TRIES_MEMORY = 10_000


class AdmissionWatcher:
    def __init__(self, bus: Bus, *, max_tries: int | None = None) -> None:
        self.bus = bus
        self.known = Owners(bus)
        self.runs = RunGate(bus)
        self.max_tries = max_tries if max_tries is not None else CONSUMERS["admission-watcher"].max_deliver
        self._tries: OrderedDict[str, int] = OrderedDict()  # event id → deliveries waiting for an owner here

    @property
    def owners(self) -> OrderedDict[str, RunRef]:
        """job uid → run, as far as this replica knows (a cache of the ``bridge`` KV entries)."""
        return self.known.memory

    async def on_event(self, ev: Event) -> None:
        watch = ev.payload(WatchEvent)
        await self.known.remember(watch)
        if watch.object.get("kind") == "Workload":
            await self.known.recall(uids_to_resolve(watch.object))  # none for the local cluster's
            if awaits_owner(watch, self.owners):
                self._wait_for_owner(ev, watch)
            self._tries.pop(ev.id, None)
        # A real cluster's object is checked against its run's namespace (``RunGate``): its labels are whatever
        # whoever may create it wrote. The local cluster alone writes its objects (its signed source says it is).
        namespace = None if ev.source == LOCAL_CLUSTER_SOURCE else \
            str((watch.object.get("metadata") or {}).get("namespace") or "")
        # Progress first: a pod's detail (why its image cannot be pulled) lands before the failure it explains.
        for out in [*progress(watch, self.owners), *translate(watch, self.owners)]:
            emit, user = await self.runs.admit(out, namespace=namespace)
            if not emit:
                continue  # a finished run or a superseded attempt: history is already decided
            await self.bus.emit(workspace=out.workspace, run_id=out.run_id, attempt=out.attempt,
                                event_type=out.event_type, payload=out.payload, dedup=out.dedup, user=user,
                                 time=ev.time)  # when the cluster saw it, not when this replica got to it
            self.runs.emitted(out)

    def _wait_for_owner(self, ev: Event, watch: WatchEvent) -> None:
        meta = watch.object.get("metadata") or {}
        what = f"Workload {meta.get('namespace', '')}/{meta.get('name', '')}"
        uids = ", ".join(owner_uids(watch.object))
        tries = self._tries.pop(ev.id, 0) + 1
        if tries >= self.max_tries:
            raise PermanentError(
                f"{what}: its Job/RayJob (uid {uids}) was never seen, neither by this replica nor in the "
                f"`bridge` KV bucket (owner.<uid>), after {tries} deliveries; is kube-bridge watching Jobs "
                "and RayJobs with the taugrid.io/managed-by label, and was the job deleted before it was seen?"
            )
        self._tries[ev.id] = tries
        while len(self._tries) > _TRIES_MEMORY:
            self._tries.popitem(last=False)
        raise TemporaryError(f"{what}: waiting for its Job/RayJob (uid {uids}) to be recorded",
                             delay=OWNER_WAIT_S)
