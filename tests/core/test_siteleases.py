"""The lease and fencing rules of a lost cluster (core/siteleases.py), with the clock passed in."""

from __future__ import annotations

from taugrid.core.siteleases import (
    WORKER_LOST_TIMEOUT_S,
    Judgement,
    Lease,
    Renewal,
    declare_lost,
    judge,
    orphans,
    renewal,
    requeue,
    silent,
)

T = 900.0  # Kueue's workerLostTimeout
UP = 1_000.0  # when the hub started


def test_the_default_timeout_is_kueues_fifteen_minutes() -> None:
    assert WORKER_LOST_TIMEOUT_S == 900.0


def test_silence_counts_from_the_later_of_the_last_renewal_and_the_hubs_start() -> None:
    assert silent(Lease("a", renewed=1_500.0), 2_000.0, UP) == 500.0
    assert silent(Lease("a", renewed=10.0), 2_000.0, UP) == 1_000.0  # renewed before the hub's restart
    assert silent(Lease("a"), 1_300.0, UP) == 300.0  # never renewed: from the hub's start
    assert silent(Lease("a", renewed=1_500.0), 1_400.0, UP) == 0.0  # a clock step back is no silence


def test_a_cluster_silent_past_the_timeout_is_lost_while_others_renew() -> None:
    leases = [Lease("a", renewed=1_000.0), Lease("b", renewed=1_950.0), Lease("c", renewed=1_990.0)]
    assert judge(leases, 1_900.0, timeout=T, hub_up_since=UP) == Judgement((), False, "")  # exactly 900 s: not yet
    assert judge(leases, 1_900.5, timeout=T, hub_up_since=UP) == Judgement(
        ("a",), False, "no lease renewal for over 900s")


def test_every_live_cluster_silent_at_once_the_hub_suspects_itself_and_expires_none() -> None:
    leases = [Lease("a", renewed=1_000.0), Lease("b", renewed=1_001.0)]
    assert judge(leases, 2_000.0, timeout=T, hub_up_since=UP) == Judgement(
        (), True, "every cluster (a, b) silent for over 900s at once: the hub suspects its own link and expires no "
                  "lease")
    # a cluster already lost is not counted among the live: the two left silent at once is still suspicion
    assert judge([Lease("x", 2, lost=True, renewed=0.0), *leases], 2_000.0, timeout=T, hub_up_since=UP).suspect_self
    # one cluster alone silent is every cluster: nowhere to requeue to and nothing expired
    assert judge([Lease("a", renewed=0.0)], 5_000.0, timeout=T, hub_up_since=UP).lost == ()


def test_after_the_hub_restarts_no_lease_expires_before_the_hub_has_been_up_for_the_timeout() -> None:
    leases = [Lease("a", renewed=100.0), Lease("b", renewed=UP + 850.0)]  # a renewed long before the restart
    assert judge(leases, UP + 899.0, timeout=T, hub_up_since=UP).lost == ()
    assert judge(leases, UP + 901.0, timeout=T, hub_up_since=UP).lost == ("a",)


def test_a_lease_already_lost_is_not_judged_again() -> None:
    leases = [Lease("a", 2, lost=True, renewed=0.0), Lease("b", renewed=1_990.0), Lease("c", renewed=0.0)]
    assert judge(leases, 2_000.0, timeout=T, hub_up_since=UP).lost == ("c",)


def test_declaring_a_cluster_lost_moves_its_generation() -> None:
    assert declare_lost(Lease("a", 3, renewed=5.0)) == Lease("a", 4, True, 5.0)


def test_only_unfinished_runs_chosen_at_a_lost_cluster_are_requeued() -> None:
    chosen = {"run.r1.a1": "a", "run.r2.a1": "b", "run.r3.a1": "a", "run.r4.a2": "a"}
    assert requeue(chosen, ["a"], finished=["run.r3.a1"]) == ["run.r1.a1", "run.r4.a2"]
    assert requeue(chosen, []) == []


def test_a_site_renews_its_own_generation_and_fences_when_the_hub_moved_it() -> None:
    assert renewal(None, 1) == Renewal(False, 1)  # first renewal
    assert renewal(Lease("a", 1, renewed=5.0), 1) == Renewal(False, 1)
    assert renewal(Lease("a", 2, lost=True), 1) == Renewal(True, 2)  # declared lost while away
    assert renewal(Lease("a", 3), 1) == Renewal(True, 3)  # lost and rejoined elsewhere meanwhile: still fenced
    assert renewal(Lease("a", 2, lost=True), 2) == Renewal(True, 2)  # lost under the generation it holds


def test_a_returning_site_stops_exactly_the_runs_the_hub_chose_elsewhere() -> None:
    running = {"r1-a1": "run.r1.a1", "r2-a1": "run.r2.a1", "r3-a1": "run.r3.a1"}
    chosen = {"run.r1.a1": "a", "run.r2.a1": "b"}  # r2 requeued to b; r3's record is gone
    assert orphans(running, chosen, "a") == ["r2-a1", "r3-a1"]
