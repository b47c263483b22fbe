"""Input limits: a YAML bomb and oversize documents refused before they cost anything, oversize submissions
rejected with a reason (never stuck in `submitted`), events bounded below the server's max_payload, and a
per-workspace submission rate limit."""

from __future__ import annotations

import resource
import time

import pytest

from taugrid.bus.connection import PayloadTooLarge
from taugrid.config import expansion
from taugrid.config.platform import load_platform
from taugrid.config.taujob import load_tau_config
from taugrid.core.contracts import Rejected, SubmitRequested
from taugrid.core.errors import ConfigError
from taugrid.core.limits import EVENT_MAX_BYTES
from tests.hardening.conftest import Stack


def yaml_bomb(levels: int = 7) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "name: bomb\nentrypoint: train.py\nexecution:\n  configs:\n    " + "\n    ".join(lines) + "\n"


def test_a_seven_level_yaml_bomb_is_refused_fast_with_bounded_memory() -> None:
    text = yaml_bomb()
    assert len(text) < 500
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_tau_config(text)
    elapsed = time.monotonic() - start
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert elapsed < 0.5
    assert grown_kib < 50 * 1024
    assert str(err.value).startswith(  # the line where the bound was passed: a4's nine aliases of a3
        "tau.yaml:9: YAML aliases expand this document to more than 20000 nodes (at least "
    )
    assert 'a "billion laughs") are refused' in str(err.value)
    assert err.value.issues[0]["fix"] == "write the values out, or use fewer nested anchors (*alias)"


def test_a_few_aliases_still_work() -> None:
    text = "name: ok\nentrypoint: t.py\nruntime:\n  env: &e {A: '1'}\nexecution:\n  configs: {x: *e}\n"
    assert load_tau_config(text).execution.configs == {"x": {"A": "1"}}


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(ConfigError, match="YAML aliases expand this document to more than 20000 nodes"):
        load_tau_config("name: r\nentrypoint: t.py\nexecution:\n  configs: &a {x: [*a]}\n")


def kueue_large_scale_platform() -> str:
    """Kueue's large-scale scheduler test's shape: 10 cohorts x 100 ClusterQueues of 20 cpu (borrowing 100). The
    first queue's resource groups are aliased by the other 999, so that the test composes few nodes; they expand
    to about 25,000."""
    group = ('&rg [{covered_resources: [cpu], flavors: [{name: default, resources: '
             '[{name: cpu, nominal_quota: "20", borrowing_limit: "100"}]}]}]')
    lines = ["resource_flavors: [{name: default}]",
             "cohorts: [" + ", ".join(f"{{name: c{c}}}" for c in range(10)) + "]", "cluster_queues:"]
    lines += [f"  - {{name: cq-{i}, cohort: c{i // 100}, resource_groups: {group if i == 0 else '*rg'}}}"
              for i in range(1000)]
    return "\n".join(lines) + "\n"


def test_a_platform_of_1000_cluster_queues_loads_past_the_tau_yaml_node_bound() -> None:
    text = kueue_large_scale_platform()
    with pytest.raises(expansion.Refused, match="more than 20000 nodes"):  # a tau.yaml's bound
        expansion.load(text, expansion.Bounds())
    platform = load_platform(text)
    assert [q.name for q in platform.cluster_queues] == [f"cq-{i}" for i in range(1000)]
    assert platform.cluster_queues[999].cohort == "c9"
    assert platform.cluster_queues[999].resource_groups == platform.cluster_queues[0].resource_groups


def test_a_yaml_bomb_in_a_platform_stops_at_the_platform_node_bound() -> None:
    with pytest.raises(ConfigError, match="expand this document to more than 200000 nodes"):
        load_platform(yaml_bomb().split("\n    ", 1)[1].replace("\n    ", "\n"))


def test_an_oversize_document_is_refused_naming_the_limit() -> None:
    text = "name: big\nentrypoint: t.py\n# " + "x" * (300 * 1024) + "\n"
    with pytest.raises(ConfigError) as err:
        load_tau_config(text)
    assert str(err.value).splitlines()[0] == (
        f"tau.yaml: the document is {len(text)} bytes; the limit for a tau.yaml is 256 KiB"
    )
    with pytest.raises(ConfigError, match="the limit for a platform.yaml is 1 MiB"):
        load_platform("workspaces: []\n# " + "x" * (1100 * 1024))


def test_a_literal_env_value_over_64_kib_names_the_field() -> None:
    text = f"name: e\nentrypoint: t.py\nruntime:\n  env:\n    BIG: '{'x' * (64 * 1024 + 1)}'\n"
    with pytest.raises(ConfigError) as err:
        load_tau_config(text)
    assert err.value.issues[0]["field"] == "runtime.env.BIG"
    assert err.value.issues[0]["message"] == "value is 65537 bytes; the limit is 65536 (64 KiB)"


async def test_an_oversize_event_is_refused_before_the_server(stack: Stack) -> None:
    with pytest.raises(PayloadTooLarge) as err:
        await stack.admin.publish("run.team-a.x.submit.requested", b"x" * (EVENT_MAX_BYTES + 1),
                                  event_type="submit.requested", ce_subject="x", msg_id="x")
    assert str(err.value) == (f"submit.requested for x is {EVENT_MAX_BYTES + 1} bytes; events are limited to "
                              "2 MiB (the server's max_payload is 8 MB)")


async def test_an_oversize_submission_is_rejected_with_its_size(stack: Stack) -> None:
    text = "name: huge\nentrypoint: t.py\nruntime:\n  env:\n    X: '" + "y" * (900 * 1024) + "'\n"
    run_id = await stack.client.submit_text(text, workspace="team-a", name="huge")
    evs = await stack.wait_for(run_id, {"submit.rejected"})
    assert [e.type for e in evs] == ["submit.requested", "submit.rejected"]
    size = len(evs[0].data)
    rejected = evs[1].payload(Rejected)
    assert (rejected.reasons[0].field, rejected.reasons[0].message) == (
        "config_text", f"the submission is {size} bytes; the limit is 512 KiB")
    assert len(evs[1].data) < 1024
    assert (await stack.client.status(run_id)).state == "rejected"


async def test_a_config_over_the_document_limit_is_rejected_not_stuck(stack: Stack) -> None:
    text = "name: big\nentrypoint: t.py\n# " + "z" * (300 * 1024) + "\n"
    run_id = await stack.client.submit_text(text, workspace="team-a", name="big")
    evs = await stack.wait_for(run_id, {"submit.rejected"})
    rejected = evs[-1].payload(Rejected)
    assert rejected.reasons[0].message == (
        f"the document is {len(text)} bytes; the limit for a tau.yaml is 256 KiB")
    assert (await stack.client.status(run_id)).state == "rejected"


async def test_stored_events_grow_by_a_bounded_factor_over_the_submission(stack: Stack) -> None:
    env = "\n".join(f"    V{i}: '{'q' * 60000}'" for i in range(2))
    text = f"name: sized\nentrypoint: t.py\nruntime:\n  env:\n{env}\n"
    run_id = await stack.client.submit_text(text, workspace="team-a", name="sized")
    evs = await stack.wait_for(run_id, {"policy.approved", "policy.rejected"})
    submitted = len(evs[0].data)
    assert evs[0].payload(SubmitRequested).config_text == text
    for ev in evs[1:]:
        assert len(ev.data) <= 2 * submitted + 16 * 1024, (ev.type, len(ev.data), submitted)


async def test_a_burst_over_the_workspace_rate_waits_its_turn_and_is_admitted_in_order(stack: Stack) -> None:
    """Workspace ``slow`` admits 60 a minute: 60 at once, then one a second, in the order submitted; none
    rejected."""
    runs = [await stack.client.submit_text("name: r\nentrypoint: t.py\n", workspace="slow", name="r")
            for _ in range(63)]
    accepted: dict[str, float] = {}
    for run_id in runs:
        evs = await stack.wait_for(run_id, {"submit.accepted", "submit.rejected"}, timeout=30)
        assert [e.type for e in evs if e.type.startswith("submit.")] == ["submit.requested", "submit.accepted"]
        accepted[run_id] = next(e.stored for e in evs if e.type == "submit.accepted")
    in_order = sorted(runs, key=lambda r: accepted[r])
    burst, paced = in_order[:60], in_order[60:]
    start = accepted[burst[0]]
    # The k-th acceptance past the burst waits for the k-th token (one a second from the first take). On a loaded
    # machine serving the burst itself can take seconds, in which time tokens refill: then the rest are due at
    # once, and must come as soon as the burst is served (one housekeeping tick of slack), never before a token.
    served = accepted[burst[-1]] - start
    for k, run_id in enumerate(paced, 1):
        waited = accepted[run_id] - start
        assert k - 0.5 <= waited <= max(k, served) + 1.5, (k, waited, served)
    # those that did wait for a token were let through in the order they were submitted (ones admitted while
    # the burst was still being served may interleave with it: they never waited)
    waiting = [r for r in paced if accepted[r] - start > served + 0.2]
    assert waiting == [r for r in runs if r in waiting]
