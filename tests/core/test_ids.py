"""Run ids: one run per submission id, distinct runs for distinct submission ids, always a DNS label."""

from __future__ import annotations

import re

from taugrid.core.ids import new_run_id, new_submission_id
from taugrid.render import object_name

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_a_repeated_submission_id_maps_to_the_same_run() -> None:
    assert new_run_id("small", "sub-1") == new_run_id("small", "sub-1")
    assert new_run_id("small", "sub-1") != new_run_id("small", "sub-2")


def test_two_hundred_thousand_same_named_submissions_get_distinct_run_ids() -> None:
    # the benchmark that lost runs: 10,500 submissions named `small` merged 3 into runs that already existed
    time_ordered = {new_run_id("small", new_submission_id()) for _ in range(100_000)}
    sequential = {new_run_id("small", f"sweep-{i}") for i in range(100_000)}
    assert len(time_ordered) == 100_000 and len(sequential) == 100_000
    assert not time_ordered & sequential


def test_a_run_id_is_a_dns_label_that_leaves_room_for_the_attempt_suffix() -> None:
    run_id = new_run_id("A Very_Long experiment name, for sweeping the learning rate x" * 2, "s")
    assert _DNS1123_LABEL.match(run_id) and len(run_id) == 57
    assert run_id.startswith("a-very-long-experiment-name-for-sweeping-")
    assert object_name(run_id, 12) == f"{run_id}-a12" and len(object_name(run_id, 12)) <= 63
