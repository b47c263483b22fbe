"""Priority lanes in run subjects (core/events.py) and which runs the platform puts in the high lane."""

from __future__ import annotations

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.resolve import lane_for
from taugrid.config.taujob import load_tau_config
from taugrid.core.events import HIGH_LANE, lane_of, parse_run_subject, run_subject
from tests.platforms import FOUR_PRIORITIES, lab_platform, workspace

PLATFORM = lab_platform(
    quota={"cpu": "8"}, priority_classes=FOUR_PRIORITIES,
    compute_profiles=[{"name": "small", "cpu": "1", "memory": "1Gi"}],
    workspaces=[workspace(default_profile="small", allowed_priority_classes=["low", "normal", "high"]),
                workspace("nodefault", default_priority=None, default_profile="small")])


def test_a_high_lane_subject_has_a_sixth_token_and_parses_to_the_same_event() -> None:
    subject = run_subject("default", "a-1", "policy.approved", lane=HIGH_LANE)
    assert subject == "run.default.a-1.policy.approved.high"
    assert parse_run_subject(subject) == parse_run_subject("run.default.a-1.policy.approved")
    assert parse_run_subject(subject) == ("default", "a-1", "policy.approved")
    assert (lane_of(subject), lane_of("run.default.a-1.policy.approved")) == (HIGH_LANE, "")


def test_a_backend_request_and_a_watch_change_know_their_lane_from_the_subject() -> None:
    """The local cluster hands a high-lane apply its lock first by this (it read "" for every backend subject)."""
    from taugrid.core.events import backend_subject, k8s_subject

    apply = backend_subject("local", "apply")
    assert (lane_of(f"{apply}.{HIGH_LANE}"), lane_of(apply)) == (HIGH_LANE, "")
    added = k8s_subject("local", "Workload", "default", "wl-1", "added", lane=HIGH_LANE)
    assert (lane_of(added), lane_of(k8s_subject("local", "Workload", "default", "wl-1", "added"))) == (HIGH_LANE, "")
    # a name that happens to be "high" is not a lane: the token count says where the lane would be
    assert lane_of(k8s_subject("local", "Workload", "default", "high", "added")) == ""
    assert lane_of("backend.local.high") == ""


def test_only_the_events_before_admission_travel_in_a_lane() -> None:
    with pytest.raises(ValueError, match="no lane 'high' for exec.running"):
        run_subject("default", "a-1", "exec.running", lane=HIGH_LANE)
    with pytest.raises(ValueError, match="no lane 'fast'"):
        run_subject("default", "a-1", "submit.requested", lane="fast")
    with pytest.raises(ValueError, match="not a run subject"):
        parse_run_subject("run.default.a-1.submit.requested.fast")


@pytest.mark.parametrize(("workspace", "priority", "lane"), [
    ("default", "high", HIGH_LANE),  # above the workspace's default
    ("default", "normal", ""),  # the default itself
    ("default", "low", ""),
    ("default", "urgent", ""),  # outranks the default, but the workspace may not use it
    ("default", "missing", ""),  # no such class: the policy refuses it
    ("default", "", ""),  # none named: the default
    ("nodefault", "low", ""),  # no default: the lowest class is the floor
    ("nodefault", "normal", HIGH_LANE),
    ("elsewhere", "high", ""),  # no such workspace
])
def test_the_high_lane_is_for_an_allowed_class_above_the_workspace_default(workspace: str, priority: str,
                                                                           lane: str) -> None:
    policy = f"policy: {{workload_priority_class: {priority}}}\n" if priority else ""
    cfg = load_tau_config(f"name: x\nentrypoint: train.py\n{policy}")
    assert lane_for(cfg, load_platform(PLATFORM), workspace) == lane
