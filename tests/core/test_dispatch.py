"""Nomination and the first-admission-wins decision (``core/dispatch.py``). The Incremental cases are Kueue's
``TestIncrementalDispatcherNominateWorkers`` (pkg/controller/workloaddispatcher, with its config-order gate on:
our clusters come in preference order), ported as data: remotes, already nominated, whether the round expired,
the step size, and the clusters nominated after."""

from __future__ import annotations

import pytest

from taugrid.config.clusters import eligible
from taugrid.config.platform import load_platform
from taugrid.core.dispatch import Admission, nominate, on_admitted, withdrawals

NOW = 1000.0
L15 = list("ONMLKJIHGFEDCBA")

# (name, remotes, nominated before, round expired, step, nominated after) — Kueue's case names
KUEUE_INCREMENTAL = [
    ("one remote", ["A"], [], False, 3, ["A"]),
    ("two remotes", ["B", "A"], [], False, 3, ["B", "A"]),
    ("three remotes", ["C", "B", "A"], [], False, 3, ["C", "B", "A"]),
    ("fifteen remotes", L15, [], False, 3, ["O", "N", "M"]),
    ("all already nominated (3)", ["C", "B", "A"], ["C", "B", "A"], True, 3, ["C", "B", "A"]),
    ("all already nominated (1)", ["A"], ["A"], True, 3, ["A"]),
    ("round expired, next set nominated", list("FEDCBA"), list("FED"), True, 3, list("FEDCBA")),
    ("round in progress, keep current", list("FEDCBA"), list("FED"), False, 3, list("FED")),
    ("round expired, nominate all", list("HGFEDCBA"), list("HGFEDC"), True, 3, list("HGFEDCBA")),
    ("no remotes", [], [], False, 3, []),
    ("stepSize=2, five remotes — first batch is exactly 2", list("EDCBA"), [], False, 2, ["E", "D"]),
    ("stepSize=2, round expired — second batch is next 2", list("EDCBA"), ["E", "D"], True, 2, list("EDCB")),
]


@pytest.mark.parametrize(("remotes", "before", "expired", "step", "after"),
                         [case[1:] for case in KUEUE_INCREMENTAL], ids=[case[0] for case in KUEUE_INCREMENTAL])
def test_incremental_nominates_as_kueue_does(remotes: list[str], before: list[str], expired: bool, step: int,
                                             after: list[str]) -> None:
    started = None if not before else (NOW - 301 if expired else NOW - 10)
    got = nominate(remotes, before, mode="Incremental", now=NOW, round_started=started, step=step)
    assert list(got.clusters) == after
    assert list(got.added) == [c for c in after if c not in before]


def test_a_round_waits_out_its_timeout_then_says_why_it_spills_over() -> None:
    first = nominate(list("ABCDE"), [], mode="Incremental", now=NOW, step=2)
    assert (first.added, first.wait_s, first.reason) == (("A", "B"), 300.0, "Incremental: nominated A, B")
    waiting = nominate(list("ABCDE"), first.clusters, mode="Incremental", now=NOW + 100,
                       round_started=first.round_started, step=2)
    assert (waiting.added, waiting.wait_s, waiting.round_started) == ((), 200.0, NOW)
    second = nominate(list("ABCDE"), first.clusters, mode="Incremental", now=NOW + 300,
                      round_started=first.round_started, step=2)
    assert (second.added, second.clusters, second.round_started) == (("C", "D"), tuple("ABCD"), NOW + 300)
    assert second.reason == "Incremental: no admission in 300s from A, B; nominated C, D"
    last = nominate(list("ABCDE"), second.clusters, mode="Incremental", now=NOW + 600,
                    round_started=second.round_started, step=2)
    assert (last.added, last.wait_s) == (("E",), None)  # nothing left after this round


def test_all_at_once_nominates_every_eligible_cluster_once() -> None:
    got = nominate(["a", "b", "c"], [], mode="AllAtOnce", now=NOW)
    assert (got.added, got.clusters, got.reason) == (("a", "b", "c"), ("a", "b", "c"), "AllAtOnce: nominated a, b, c")
    assert nominate(["a", "b", "c"], got.clusters, mode="AllAtOnce", now=NOW + 999).added == ()
    assert nominate([], [], mode="AllAtOnce", now=NOW).reason == "no cluster serves this run's cluster queue"


def test_spill_over_follows_preference_and_the_queues_each_cluster_serves() -> None:
    platform = load_platform("""\
resource_flavors: [{name: default}]
cluster_queues:
  - name: research
    resource_groups:
      - {covered_resources: [cpu], flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8}]}]}
  - name: batch
    resource_groups:
      - {covered_resources: [cpu], flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8}]}]}
clusters:
  - {name: cloud-1, backend: kubernetes, preference: 10}
  - {name: onprem-1, backend: local, cluster_queues: [research]}
  - {name: onprem-2, backend: local}
  - {name: cloud-2, backend: kubernetes, preference: 10}
""")
    research = eligible(platform.clusters, "research")
    assert research == ["onprem-1", "onprem-2", "cloud-1", "cloud-2"]
    assert eligible(platform.clusters, "batch") == ["onprem-2", "cloud-1", "cloud-2"]
    assert nominate(research, [], mode="Incremental", now=NOW, step=2).added == ("onprem-1", "onprem-2")


def test_the_first_nominated_cluster_to_admit_wins_and_the_others_are_withdrawn() -> None:
    nominated = ["a", "b", "c"]
    assert on_admitted("b", nominated, None) == Admission("claim", "b admitted it first")
    assert on_admitted("b", nominated, "b") == Admission("won", "b is the run's cluster already")
    assert on_admitted("a", nominated, "b") == Admission("withdraw", "b admitted it first")
    assert withdrawals("b", nominated) == ["a", "c"]
    # a cluster never nominated cannot claim the run, whatever it reports
    assert on_admitted("x", nominated, None) == Admission(
        "refuse", "cluster x was not nominated for this run (nominated: a, b, c)")


def test_the_run_record_keeps_where_its_attempt_went_and_tau_status_says_why() -> None:
    from taugrid.cli.views import phase_tree
    from taugrid.core import states

    r = states.RunRecord(run_id="r", workspace="ws", state="applied", attempt=2, created=1.0)
    chosen = {"clusters": ["onprem-c"], "mode": "AllAtOnce", "reason": "onprem-c admitted it first"}
    assert not states.apply(r, "dispatch.chosen", 1, chosen, 2.0)  # an older attempt's choice
    assert states.apply(r, "dispatch.chosen", 2, chosen, 3.0)
    assert (r.cluster, r.cluster_reason, r.state) == ("onprem-c", "onprem-c admitted it first", "applied")
    assert "  cluster: onprem-c (onprem-c admitted it first)" in phase_tree(r).splitlines()
    # another cluster's withdrawal changes nothing; the chosen one's (it was lost) reopens the choice
    assert not states.apply(r, "dispatch.withdrawn", 2, {"clusters": ["a"], "mode": "AllAtOnce",
                                                          "reason": "onprem-c admitted it first"}, 4.0)
    lost = {"clusters": ["onprem-c"], "mode": "AllAtOnce", "reason": "onprem-c lost: no lease renewal for over 2s"}
    assert not states.apply(r, "dispatch.withdrawn", 1, lost, 5.0)  # an older attempt's
    assert states.apply(r, "dispatch.withdrawn", 2, lost, 5.0)
    assert "  cluster: none now (onprem-c lost: no lease renewal for over 2s)" in phase_tree(r).splitlines()
    assert not states.apply(r, "dispatch.nominated", 2, {"clusters": ["a"], "mode": "AllAtOnce", "reason": ""}, 6.0)
    assert states.apply(r, "dispatch.chosen", 2, {**chosen, "clusters": ["a"], "reason": "a admitted it first"}, 7.0)
    # the chosen cluster preempted the run: nominated again, the choice is open
    again = {"clusters": ["a", "b"], "mode": "AllAtOnce", "reason": "a preempted it (by r2); AllAtOnce: nominated a, b "
             "again"}
    assert states.apply(r, "dispatch.nominated", 2, again, 8.0)
    assert (r.cluster, r.cluster_reason) == ("", again["reason"])


def test_one_cluster_at_a_time_may_preempt_for_a_run() -> None:
    """KEP-8303's ungating, first come first served: the first cluster to need to preempt is let; the next waits
    until the one let has had the gate timeout without the run admitted."""
    from taugrid.core.dispatch import Grant, preemption_grant

    assert preemption_grant([], [], 0.0, now=NOW) == Grant("", None, "no other cluster waits to preempt for it")
    assert preemption_grant(["b", "a"], [], 0.0, now=NOW) == Grant(
        "b", None, "b may preempt for it (the first cluster that needs to; one at a time)")
    assert preemption_grant(["b", "a"], ["b"], NOW, now=NOW + 299.0) == Grant(
        "", 1.0, "b may preempt for it; a wait until 300s have passed")
    assert preemption_grant(["b", "a"], ["b"], NOW, now=NOW + 300.0) == Grant(
        "a", None, "a may preempt for it: b did not get it admitted within 300s")
    assert preemption_grant(["b", "a"], ["b", "a"], NOW, now=NOW + 900.0).cluster == ""  # every one was let
    assert preemption_grant(["b", "a", "c"], ["b"], NOW, now=NOW + 60.0, timeout=60.0).cluster == "a"
    # the cluster let was lost: it gave up, the next is let at once; a lost cluster is never let
    assert preemption_grant(["b", "a"], ["b"], NOW, now=NOW + 1.0, lost={"b"}) == Grant(
        "a", None, "a may preempt for it: b, let before, was lost")
    assert preemption_grant(["b", "a"], [], 0.0, now=NOW, lost={"b"}).cluster == "a"
    assert preemption_grant(["b"], [], 0.0, now=NOW, lost={"b"}).cluster == ""
