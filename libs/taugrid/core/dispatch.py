"""Dispatch across clusters, as Kueue's MultiKueue does it (pure: no I/O, the time passed in).

A run's copy goes to the clusters *nominated* for it; each cluster's own admission decides; the first cluster to
admit wins, is written once as the run's cluster, and every other copy is withdrawn.

Nomination (Kueue's ``workloaddispatcher``): ``AllAtOnce`` nominates every eligible cluster at once;
``Incremental`` nominates ``step`` clusters (Kueue's default 3), and when a round has lasted ``round_timeout``
(Kueue's 5 minutes) without an admission it adds the next ``step`` — the earlier ones stay nominated. Eligible
clusters come in preference order (``config.clusters.eligible``: lower ``preference`` first, the file's order among
equals), which is Kueue's ``MultiKueueIncrementalDispatcherRespectConfigOrder``: on-premises clusters first, the
cloud only when they have not admitted in time (ordered spill-over, kueue#9270).

Preemption, one cluster at a time (Kueue's orchestrated preemption, KEP-8303): a copy that could fit at its cluster
only by preempting waits there *gated* and says so; ``preemption_grant`` lets the first cluster that said so
preempt, and the next one only when the one let has not got the run admitted within the gate timeout (its
preemption failed or did not suffice), so one high-priority run never evicts work on every cluster at once.

Invariants: ``nominate`` never drops a nominated cluster and never nominates one twice; ``on_admitted`` lets a
cluster win only if it was nominated and no other cluster won, so the chosen cluster is decided once (the caller
writes it with a compare-and-set and, losing that race, asks again with the winner it read).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

Mode = Literal["AllAtOnce", "Incremental"]
DEFAULT_STEP = 3  # Kueue's DefaultStepSize
ROUND_TIMEOUT_S = 300.0  # Kueue's incrementalDispatcherRoundTimeout
PREEMPTION_GATE_TIMEOUT_S = 300.0  # KEP-8303's PreemptionGateTimeout default


@dataclass(frozen=True)
class Nomination:
    """What to do now: ``added`` are the clusters to send a copy to (none: nothing to do yet), ``clusters`` every
    cluster nominated so far in order, ``round_started`` when the current round began, ``wait_s`` until the
    next round may add more (None: no more rounds), ``reason`` one line for the run's event."""

    added: tuple[str, ...]
    clusters: tuple[str, ...]
    round_started: float
    wait_s: float | None
    reason: str


def nominate(eligible: Sequence[str], nominated: Sequence[str], *, mode: Mode, now: float,
             round_started: float | None = None, step: int = DEFAULT_STEP,
             round_timeout: float = ROUND_TIMEOUT_S) -> Nomination:
    """The next nomination for a run not admitted anywhere yet. ``eligible`` in preference order; ``nominated``
    so far (empty for a new run); ``round_started`` of the current round (None before the first)."""
    if step < 1:
        raise ValueError(f"step must be at least 1, not {step}")
    remaining = [c for c in eligible if c not in nominated]
    so_far = tuple(nominated)
    if not eligible:
        return Nomination((), so_far, now, None, "no cluster serves this run's cluster queue")
    if mode == "AllAtOnce":
        if not remaining:
            return Nomination((), so_far, round_started if round_started is not None else now, None,
                              "every eligible cluster is nominated")
        return Nomination(tuple(remaining), (*so_far, *remaining), now, None,
                          f"AllAtOnce: nominated {', '.join(remaining)}")
    if round_started is not None and now - round_started < round_timeout:
        return Nomination((), so_far, round_started, round_timeout - (now - round_started),
                          "Incremental: the round is still in progress")
    if not remaining:
        return Nomination((), so_far, round_started if round_started is not None else now, None,
                          "Incremental: no more clusters to nominate")
    added = tuple(remaining[:step])
    more = len(remaining) > step
    why = (f"Incremental: nominated {', '.join(added)}" if not so_far else
           f"Incremental: no admission in {round_timeout:g}s from {', '.join(so_far)}; nominated {', '.join(added)}")
    return Nomination(added, (*so_far, *added), now, round_timeout if more else None, why)


Verdict = Literal["claim", "won", "withdraw", "refuse"]


@dataclass(frozen=True)
class Admission:
    """What a cluster's admission of a run's copy means: ``claim`` (write this cluster as the run's, once), ``won``
    (it is the run's cluster already: a repeat), ``withdraw`` (another cluster won: take this copy back), ``refuse``
    (this cluster was never nominated: nothing it says about the run counts)."""

    verdict: Verdict
    reason: str


def on_admitted(cluster: str, nominated: Sequence[str], chosen: str | None) -> Admission:
    """The decision on ``cluster`` admitting a run's copy, given the clusters nominated and the cluster already
    chosen (None: none yet)."""
    if cluster not in nominated:
        return Admission("refuse", f"cluster {cluster} was not nominated for this run "
                         f"(nominated: {', '.join(nominated) or 'none'})")
    if chosen is None:
        return Admission("claim", f"{cluster} admitted it first")
    if chosen == cluster:
        return Admission("won", f"{cluster} is the run's cluster already")
    return Admission("withdraw", f"{chosen} admitted it first")


def withdrawals(chosen: str, nominated: Sequence[str]) -> list[str]:
    """The copies to take back once ``chosen`` won: every other nominated cluster, in nomination order."""
    return [c for c in nominated if c != chosen]


@dataclass(frozen=True)
class Grant:
    """Which cluster to let preempt for a run now (``cluster``; "" none), how long until the grant may pass on
    (``wait_s``; None: nothing to wait for) and why."""

    cluster: str
    wait_s: float | None
    reason: str


def preemption_grant(gated: Sequence[str], granted: Sequence[str], granted_at: float, *, now: float,
                     timeout: float = PREEMPTION_GATE_TIMEOUT_S, lost: Collection[str] = ()) -> Grant:
    """One cluster at a time may preempt for a run not admitted anywhere yet. ``gated``: the nominated clusters that
    reported they could admit it only by preempting, in the order they did (first come, first served);
    ``granted``: those let preempt so far, in order, the last since ``granted_at``. The first gated cluster not let
    yet is let when none is, when the last one let has had ``timeout`` without the run being admitted, or at once
    when that one is ``lost`` (its lease expired: it gave up); a lost cluster is never let."""
    waiting = [c for c in gated if c not in granted and c not in lost]
    holder = granted[-1] if granted else ""
    if not waiting:
        return Grant("", None, "no other cluster waits to preempt for it")
    if holder and holder not in lost and now - granted_at < timeout:
        return Grant("", timeout - (now - granted_at),
                     f"{holder} may preempt for it; {', '.join(waiting)} wait until {timeout:g}s have passed")
    if not holder:
        return Grant(waiting[0], None, f"{waiting[0]} may preempt for it (the first cluster that needs to; "
                                       "one at a time)")
    if holder in lost:
        return Grant(waiting[0], None, f"{waiting[0]} may preempt for it: {holder}, let before, was lost")
    return Grant(waiting[0], None, f"{waiting[0]} may preempt for it: {holder} did not get it admitted "
                                   f"within {timeout:g}s")
