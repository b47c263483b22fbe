"""The submitter hands the platform bucket's mark it asked, after the request was stored, to the policy
(``SubmitAccepted.platform_mark``), which resolves without asking again while it holds its platform under that
same mark (issue 30: one round trip fewer on every idle run's path). An apply that returned before a request was
stored is in every mark asked after it, so it still binds the request; a request whose submitter read the
platform before an apply returned is resolved as that submitter saw it."""

from __future__ import annotations

from taugrid.bus import identity, platformstore
from taugrid.bus.platformread import mark_token
from taugrid.core.contracts import Rejected, SubmitAccepted, SubmitRequested
from taugrid.core.ids import new_run_id, new_submission_id
from tests.hardening.conftest import Stack
from tests.owners import emit_as_owner
from tests.platforms import lab_platform, workspace

DONE = {"policy.approved", "policy.rejected", "submit.rejected"}
ALICE, BOB = (identity.public_key(identity.new_user_seed()) for _ in range(2))


def team(*members: str) -> str:
    return lab_platform(workspaces=[workspace("team-a", members=list(members))],
                        users=[{"name": "alice", "nkey": ALICE}, {"name": "bob", "nkey": BOB}])


async def _accepted(stack: Stack, *, mark: str) -> str:
    """A run's ``submit.accepted`` for alice as the submitter writes it, with ``mark``; its last stage event."""
    sid = new_submission_id()
    run = new_run_id("marked", sid)
    await emit_as_owner(stack.admin, workspace="team-a", run_id=run, attempt=1, event_type="submit.accepted",
                        user="alice", payload=SubmitAccepted(
                            submission_id=sid, config={"name": "marked", "entrypoint": "t.py"}, user="alice",
                            platform_mark=mark))
    evs = await stack.wait_for(run, DONE)
    if evs[-1].type == "policy.rejected":
        return "policy.rejected: " + evs[-1].payload(Rejected).reasons[0].message
    return evs[-1].type


async def test_submit_accepted_carries_the_mark_the_submitter_asked(stack: Stack) -> None:
    run = await stack.client.submit_request(
        SubmitRequested(submission_id="", config_text="name: marked\nentrypoint: t.py\n"),
        workspace="team-a", name="marked", span="test")
    evs = await stack.wait_for(run, DONE)
    [accepted] = [e.payload(SubmitAccepted) for e in evs if e.type == "submit.accepted"]
    assert accepted.platform_mark == mark_token(await platformstore.mark(stack.admin))
    assert evs[-1].type == "policy.approved"


async def test_an_apply_binds_each_request_whose_submitter_read_after_it(stack: Stack) -> None:
    await platformstore.put_text(stack.admin, team("alice"))
    before = mark_token(await platformstore.mark(stack.admin))
    assert await _accepted(stack, mark="") == "policy.approved"  # the policy reads the platform under `before`
    await platformstore.put_text(stack.admin, team("bob"))  # alice removed; the apply returned
    after = mark_token(await platformstore.mark(stack.admin))
    assert after != before
    # stored before the apply returned (its submitter asked `before`): resolved as that submitter saw the platform
    assert await _accepted(stack, mark=before) == "policy.approved"
    # stored after: its submitter's mark is newer than the one the policy holds, so the policy asks and fetches
    refused = "policy.rejected: user 'alice' is not a member of workspace 'team-a'"
    assert await _accepted(stack, mark=after) == refused
    assert await _accepted(stack, mark="") == refused  # an earlier release's submitter hands none: asked
    assert await _accepted(stack, mark="7/7/not-this-bucket") == refused  # a mark the policy does not hold: asked
