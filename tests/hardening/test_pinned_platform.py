"""`tau reproduce`'s submission names the platform revision its run was resolved against: policy resolves against
that revision, not the newest, and rejects one the bucket no longer keeps with the field and the fix."""

from __future__ import annotations

from taugrid.bus import platformstore
from taugrid.core.contracts import PolicyApproved, Rejected, SubmitRequested
from tests.hardening.conftest import Stack

CONFIG = "name: pinned\nentrypoint: t.py\n"


async def test_a_pinned_revision_is_resolved_against_and_a_missing_one_rejected(stack: Stack) -> None:
    text, old = await platformstore.get_text(stack.admin)  # type: ignore[misc]
    newer = await platformstore.put_text(stack.admin, text.replace("default_priority: normal",
                                                                   "default_priority: normal  # edited"))
    assert newer > old
    pinned = await stack.client.submit_request(
        SubmitRequested(submission_id="", config_text=CONFIG, platform_revision=old),
        workspace="team-a", name="pinned", span="test")
    evs = await stack.wait_for(pinned, {"policy.approved", "policy.rejected", "submit.rejected"})
    assert evs[-1].type == "policy.approved"
    assert evs[-1].payload(PolicyApproved).platform_revision == old  # not the newest

    gone = await stack.client.submit_request(
        SubmitRequested(submission_id="", config_text=CONFIG, platform_revision=newer + 1000),
        workspace="team-a", name="gone", span="test")
    evs = await stack.wait_for(gone, {"policy.approved", "policy.rejected", "submit.rejected"})
    [issue] = evs[-1].payload(Rejected).reasons
    assert (evs[-1].type, issue.field, issue.message, issue.fix) == (
        "policy.rejected", "platform_revision",
        f"platform revision {newer + 1000} is no longer kept (the platform bucket keeps 64 revisions)",
        "run it against the current platform instead: `tau run retry RUN`")
