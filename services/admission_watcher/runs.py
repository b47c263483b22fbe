"""Whether a translated run event may still be emitted, with the ``run_state`` read only on doubt.

An output is dropped when its run has finished or its attempt is superseded: history is decided, and a late or
redelivered watch event must never add to it. The run record says so, but reading it for every output (seven a
run) was most of this service's bus traffic. So each replica keeps, per run, what the last read told it (attempt,
finished, the verified user) and what it emitted since, and reads again only on doubt:

- a run this replica has not read (a new run, another replica's, or any run after a restart: redeliveries are
  always checked against the record);
- an attempt newer than the one it read;
- after it emitted ``exec.failed`` or ``admission.preempted``, until the record shows a new attempt (recovery
  may now retry or give up: a new attempt or a finished run this replica would not see);
- an answer older than ``TRUST_S`` (what other services decided meanwhile: a cancel, a health retry, another
  replica's ending);
- a run whose submitter is not verified yet (the emit needs the verified user);
- an output that decides the run's fate (``DECISIVE``: succeeded, failed, cancelled, preempted), always: an
  ``exec.cancelled`` of a superseded attempt (its Job deleted after a retry) would otherwise cancel the run;
- an object of a real cluster (``namespace`` given) in another namespace than the one last read for its run.

A real cluster's object names its run by labels, which whoever may create a pod, Job or Workload in some
namespace can write: so such an output is emitted only when the object lives in the namespace the policy
rendered the run into (the record's ``resolved.namespace``), and waits (``not_projected``) while the record has
no policy decision yet. Give each workspace its own namespace: within one namespace its members can already
create what they like. The local cluster is the only writer of its objects and is not checked.

What never needs a read: a run known finished, an attempt older than the one known, or an attempt this replica
ended itself (``exec.succeeded`` / ``exec.cancelled``): those never come back. The read itself decodes only the
three fields it needs (``runrecord.summary``), not the record's history.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from taugrid import runrecord
from taugrid.bus.connection import Bus
from taugrid.core.states import TERMINAL
from taugrid.kube.translate import RunEventOut

log = logging.getLogger("taugrid.admission_watcher")

TRUST_S = 5.0  # how long a read's "still running, this attempt" is taken as still true
MEMORY = 20_000  # runs remembered (least recently used out)
ENDS_ATTEMPT = frozenset({"exec.succeeded", "exec.cancelled"})  # the projection makes the run terminal
UNSETTLES = frozenset({"exec.failed", "admission.preempted"})  # recovery decides what comes next
DECISIVE = ENDS_ATTEMPT | UNSETTLES  # always checked against the record


@dataclass(slots=True)
class _Known:
    attempt: int
    finished: bool
    user: str  # "" while the submitter has not decided the run
    read_at: float
    ended: int = 0  # the newest attempt this replica ended itself (exec.succeeded / exec.cancelled)
    doubt: bool = False  # this replica emitted something that lets recovery change the run
    namespace: str = ""  # where the policy rendered the run ("" before it decided)


class RunGate:
    def __init__(self, bus: Bus, *, trust_s: float = TRUST_S, memory: int = MEMORY) -> None:
        self.bus, self.trust_s, self.limit = bus, trust_s, memory
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()
        self.reads = 0  # run_state reads, for tests and benchmarks

    async def admit(self, out: RunEventOut, *, namespace: str | None = None) -> tuple[bool, str | None]:
        """(emit it?, the run's verified user for the emit, or None to let the emit look it up). ``namespace``:
        the namespace of the real cluster's object ``out`` was translated from (None: the local cluster's)."""
        run = (out.workspace, out.run_id)
        known = self._known.get(run)
        if known is not None:
            self._known.move_to_end(run)
            if known.finished or out.attempt < known.attempt or out.attempt <= known.ended:
                return False, None
            if (out.attempt == known.attempt and known.user and not known.doubt and out.event_type not in DECISIVE
                    and time.monotonic() - known.read_at < self.trust_s
                    and (namespace is None or namespace == known.namespace)):
                return True, known.user
        gate = await self._read(out.workspace, out.run_id)
        if namespace is not None and (gate is None or not gate.namespace):
            # a real cluster's object for a run the policy has not placed yet: ours only once it has
            raise runrecord.not_projected(out.run_id, f"{out.event_type} from a cluster waits for the policy's "
                                                      "decision, which names the run's namespace")
        if gate is None:
            return True, None  # no record yet: emitted as before, the emit resolves (or waits for) the user
        user = gate.user if gate.user and gate.state not in runrecord.UNDECIDED else ""
        ended = known.ended if known is not None else 0
        doubt = known is not None and known.doubt and known.attempt == gate.attempt  # recovery has not acted yet
        self._known[run] = _Known(attempt=gate.attempt, finished=gate.state in TERMINAL, user=user,
                                  read_at=time.monotonic(), ended=ended, doubt=doubt, namespace=gate.namespace)
        self._known.move_to_end(run)
        while len(self._known) > self.limit:
            self._known.popitem(last=False)
        if gate.state in TERMINAL or out.attempt < gate.attempt or out.attempt <= ended:
            return False, None
        if namespace is not None and namespace != gate.namespace:
            log.warning("%s for run %s/%s dropped: its object is in namespace %r, the run was rendered into %r "
                        "(labels claim the run; the namespace is what the cluster vouches for)", out.event_type,
                        out.workspace, out.run_id, namespace, gate.namespace)
            return False, None
        return True, user or None

    def emitted(self, out: RunEventOut) -> None:
        """Note what this replica just emitted for the run."""
        known = self._known.get((out.workspace, out.run_id))
        if known is None:
            return
        if out.event_type in ENDS_ATTEMPT:
            known.ended = max(known.ended, out.attempt)
        elif out.event_type in UNSETTLES:
            known.doubt = True

    async def _read(self, workspace: str, run_id: str) -> runrecord.Summary | None:
        self.reads += 1
        return await runrecord.summary(self.bus, workspace, run_id)
