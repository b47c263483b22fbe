"""`tau reproduce`'s submission names the platform revision its run was resolved against: policy resolves against
that revision, not the newest, but only for a reproduction of a run of the same workspace resolved against it
from the same config; a bare pin is rejected with the field and the fix (any researcher could otherwise resolve a
new config under a policy since withdrawn)."""

from __future__ import annotations

from taugrid.bus import platformstore
from taugrid.core.contracts import PolicyApproved, Rejected, SubmitRequested
from tests.hardening.conftest import Stack

CONFIG = "name: pinned\nentrypoint: t.py\n"


async def test_a_reproduction_is_resolved_against_its_runs_revision_and_a_bare_pin_rejected(stack: Stack) -> None:
    _, old = await platformstore.get_text(stack.admin)  # type: ignore[misc]
    original = await stack.client.submit_request(SubmitRequested(submission_id="", config_text=CONFIG),
                                                 workspace="team-a", name="pinned", span="test")
    evs = await stack.wait_for(original, {"policy.approved", "policy.rejected", "submit.rejected"})
    assert (evs[-1].type, evs[-1].payload(PolicyApproved).platform_revision) == ("policy.approved", old)

    text, _ = await platformstore.get_text(stack.admin)  # type: ignore[misc]
    newer = await platformstore.put_text(stack.admin, text.replace("default_priority: normal",
                                                                   "default_priority: normal  # edited"))
    assert newer > old
    again = await stack.client.submit_request(
        SubmitRequested(submission_id="", config_text=CONFIG, platform_revision=old, reproduces=original),
        workspace="team-a", name="pinned", span="test")
    evs = await stack.wait_for(again, {"policy.approved", "policy.rejected", "submit.rejected"})
    assert evs[-1].type == "policy.approved"
    assert evs[-1].payload(PolicyApproved).platform_revision == old  # not the newest

    bare = await stack.client.submit_request(
        SubmitRequested(submission_id="", config_text=CONFIG, platform_revision=old),
        workspace="team-a", name="bare", span="test")
    evs = await stack.wait_for(bare, {"policy.approved", "policy.rejected", "submit.rejected"})
    [issue] = evs[-1].payload(Rejected).reasons
    assert (evs[-1].type, issue.field, issue.message, issue.fix) == (
        "policy.rejected", "platform_revision",
        f"platform revision {old} is pinned only to reproduce a run of workspace team-a resolved against it from "
        "the same config (no run named)",
        "submit without platform_revision (the current platform applies), or `tau reproduce RUN`")
