"""The config is parsed once, by the submitter: ``submit.accepted`` carries its parse (the folded config), and the
policy resolves from that parse, never the text again: an accepted event whose text says something else is
resolved as its parse says. A refusal at resolution still names the line, read back from the request's text
(``services/policy/keylines``), and only from the request the submitter answered, whose text hashes to the
accepted config."""

from __future__ import annotations

from taugrid.config import accepted
from taugrid.config.taujob import load_tau_config
from taugrid.core.contracts import PolicyApproved, Rejected, SubmitAccepted, SubmitRequested
from taugrid.core.ids import new_run_id, new_submission_id
from tests.hardening.conftest import Stack
from tests.owners import emit_as_owner

DONE = {"policy.approved", "policy.rejected", "submit.rejected"}


async def test_the_submitters_parse_is_on_the_record_and_the_policys_refusal_names_the_line(stack: Stack) -> None:
    text = "name: once\nentrypoint: t.py\npolicy:\n  profile: no-such-profile\n"
    run = await stack.client.submit_request(SubmitRequested(submission_id="", config_text=text),
                                            workspace="team-a", name="once", span="test")
    evs = await stack.wait_for(run, DONE)
    [accepted_event] = [e for e in evs if e.type == "submit.accepted"]
    acc = accepted_event.payload(SubmitAccepted)
    cfg = load_tau_config(text)
    # the text is the request's (sealed from there), not copied onto submit.accepted (issue 27)
    assert (acc.config, acc.config_text, acc.config_managed) == (accepted.record(cfg).config, "", False)
    [requested] = [e for e in evs if e.type == "submit.requested"]
    req = requested.payload(SubmitRequested)
    assert req.config_text == text
    # nor the request's signature, nor the config's defaults (issue 27): the stored body holds the parse as written
    assert (acc.signature, acc.signer) == ("", requested.signer) and requested.signature
    assert b'"signature"' not in accepted_event.data and b'"resilience"' not in accepted_event.data
    assert acc.config == {"name": "once", "engine": "job", "entrypoint": "t.py",
                          "policy": {"profile": "no-such-profile"}}
    # nor the key lines nor the config's hash (issue 27): only a refusal names lines, and the policy reads them back
    # from the request; it hashes the parse it resolves itself
    assert (acc.config_lines, acc.config_hash) == ([], "")
    assert b'"config_lines"' not in accepted_event.data and b'"config_hash"' not in accepted_event.data
    assert evs[-1].type == "policy.rejected"
    [issue] = evs[-1].payload(Rejected).reasons
    assert (issue.field, issue.line) == ("policy.profile", 4)


async def test_the_policy_resolves_the_accepted_parse_not_the_text(stack: Stack) -> None:
    """Only the submitter may publish submit.accepted, and what it parsed is what runs: the text rides along for
    the evidence (here it would not even parse)."""
    parsed = accepted.record(load_tau_config("name: from-parse\nentrypoint: parsed.py\n"))
    # as this release's submitter writes it (the policy hashes the parse), and as an earlier one did (its hash)
    for carried in ("", parsed.config_hash):
        sid = new_submission_id()
        run = new_run_id("from-parse", sid)
        await emit_as_owner(stack.admin, workspace="team-a", run_id=run, attempt=1, event_type="submit.accepted",
                            user="owner", payload=SubmitAccepted(
                                submission_id=sid, config=parsed.config, config_hash=carried,
                                config_text="name: [not: yaml", config_lines=parsed.lines, user="owner"))
        evs = await stack.wait_for(run, DONE)
        assert evs[-1].type == "policy.approved"
        approved = evs[-1].payload(PolicyApproved).run
        assert (approved.name, approved.config_hash, approved.command[-1]) == (
            "from-parse", parsed.config_hash, "parsed.py")


async def test_a_refusal_places_its_keys_only_from_the_answered_request(stack: Stack) -> None:
    """No request stored for the run (an accepted record published without one): the refusal is the same, its key
    named without a line. An earlier release's record carrying its key lines is placed by them."""
    parsed = accepted.record(load_tau_config("name: lines\nentrypoint: t.py\npolicy:\n  profile: no-such\n"))
    placed = {}
    for lines in ([], [(("policy",), 3), (("policy", "profile"), 7)]):
        sid = new_submission_id()
        run = new_run_id("lines", sid)
        await emit_as_owner(stack.admin, workspace="team-a", run_id=run, attempt=1, event_type="submit.accepted",
                            user="owner", payload=SubmitAccepted(
                                submission_id=sid, config=parsed.config, config_hash=parsed.config_hash,
                                config_lines=lines, user="owner"))
        evs = await stack.wait_for(run, DONE)
        assert evs[-1].type == "policy.rejected"
        [issue] = evs[-1].payload(Rejected).reasons
        placed[len(lines)] = (issue.field, issue.line, issue.message)
    assert placed == {0: ("policy.profile", None, "unknown compute profile 'no-such'"),
                      2: ("policy.profile", 7, "unknown compute profile 'no-such'")}
