"""Submission handling.

Identity: a submission is accepted only with a valid signature by a known user (``signers.Signers``); the
verified name — never the client's claim — goes on ``submit.accepted`` (payload ``user`` and ``ce-tauuser``), from
where every later event of the run carries it. The workspace is taken from the signed body and must match the
signed subject, so a re-routed copy cannot land in another workspace.

The config: the submitter is its one parser of record (``parsed``). ``submit.accepted`` carries the validated
config (``config.accepted.record``) that the policy resolves, and the user's exact text only for the evidence.

Priority lanes: ``submit.requested`` arrives on the default durable or the high lane's (``submitter-high``), as the
client claimed; ``submit.accepted`` goes on the lane the submitter decides from the parsed config and the
platform (``_lane``), so a claim the platform does not back only ever skipped this one stage's queue.

Pacing: over its workspace's rate a new submission is not rejected; it waits in the stream for its slot
(``ratelimit.Pacer``, nak'ed with ``NotYet``) and is accepted then, in the order the slots were reserved.

Idempotent: the run id derives from the submission id, the submission is claimed with a KV create (once), and
``submit.accepted`` has a deterministic message id; a redelivery either re-emits the same (deduplicated) event
or, when the run already moved on, does nothing.
"""

from __future__ import annotations

import asyncio
import functools

from taugrid import runrecord
from taugrid.access.signers import Refused, Signers
from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config import accepted
from taugrid.config.platform import Platform
from taugrid.config.resolve import lane_for
from taugrid.config.taujob import TauConfig, load_tau_config_shared
from taugrid.core.contracts import Issue, Rejected, SubmitAccepted, SubmitRequested, issues_of
from taugrid.core.errors import ConfigError, NotFound, NotYet, PermanentError
from taugrid.core.ids import run_claim, token
from taugrid.core.limits import (
    DEFAULT_SUBMISSIONS_PER_MINUTE,
    SNAPSHOT_UPLOAD_MAX_BYTES,
    SUBMISSION_MAX_BYTES,
    size_text,
)
from taugrid.sources import snapshots
from taugrid_services.submitter import ratelimit

# How long a submission id is remembered (``submissions`` KV; issue 27: the key went only with the bucket, one
# indexed subject per run ever submitted). It only has to outlive a repeat of its request: a signed request
# is refused 300 s after it was signed (``envelope.SIGNATURE_MAX_AGE_S``) and a paced one waits at most
# ``PACED_SUBMISSIONS_MAX`` slots of a minute (8.3 h), both well within a day. The run's own claim
# (``id.<run>``, ``_first_for_run``) is kept: it stops a late request answering into a sealed run.
SUBMISSION_ID_TTL_S = 24 * 3600.0


@functools.lru_cache(maxsize=256)
def parsed(config_text: str, config_path: str) -> tuple[TauConfig, accepted.Accepted]:
    """The one parse of record of a submission's tau.yaml, and what ``submit.accepted`` carries of it (every later
    stage reads that, never the text); pure functions of the text, so memoised (read-only: shared by every run
    with the same text). Raises ``ConfigError`` (never cached)."""
    cfg = load_tau_config_shared(config_text, path=config_path)
    return cfg, accepted.record(cfg)


def _rate_limit(platform: Platform | None, workspace: str) -> int:
    ws = platform.workspace(workspace) if platform is not None else None
    if ws is None or ws.submissions_per_minute is None:
        return DEFAULT_SUBMISSIONS_PER_MINUTE
    return ws.submissions_per_minute


def _lane(cfg: TauConfig, platform: Platform | None, workspace: str) -> str:
    """The lane ``submit.accepted`` goes on, decided here from the parsed config and the current platform
    (whatever lane the client claimed): high only for a class the workspace allows that outranks its default.
    The policy decides the real priority and lane of ``policy.approved`` again."""
    if platform is None:
        return ""
    return lane_for(cfg, platform, workspace)


class Submitter:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.signers = Signers(bus)
        self.pacer = ratelimit.Pacer(bus)

    async def on_requested(self, ev: Event) -> None:
        # in hand from here, before any round trip: a paced workspace's slots go in stream order (ratelimit.Pacer)
        self.pacer.enter(ev.workspace, ev.seq)
        try:
            await self._requested(ev)
        finally:
            await self.pacer.leave(ev.workspace, ev.seq)

    async def _requested(self, ev: Event) -> None:
        # The platform (its mark: one round trip) is read while the run's claim is checked, not after it: the
        # claim still decides first, and the signer is still checked against a platform read after the request
        # arrived (issue 30: the sequential round trips were most of this stage's idle latency).
        platform_read = asyncio.ensure_future(self.signers.platform_marked())
        try:
            await self._answer(ev, platform_read)
        finally:
            if not platform_read.done():
                platform_read.cancel()  # a request refused before it needed the platform
            elif not platform_read.cancelled():
                platform_read.exception()  # its failure, if any, was raised where it was awaited or is moot

    async def _answer(self, ev: Event, platform_read: asyncio.Future[tuple[Platform | None, str]]) -> None:
        if not await self._first_for_run(ev):
            raise PermanentError(
                f"run {ev.subject} in workspace {ev.workspace} already has a submission (another message of the "
                "stream claimed it): a second request for the same run is never answered, so nobody can write "
                "a rejection into a run that is not theirs")
        if len(ev.data) > SUBMISSION_MAX_BYTES:
            # refused before decoding: the rejection is small whatever was sent, so the run never sticks in
            # `submitted` on a derived event the server would refuse
            await self._reject(ev, [Issue(
                field="config_text",
                message=f"the submission is {len(ev.data)} bytes; the limit is {size_text(SUBMISSION_MAX_BYTES)}",
                fix="keep large data out of tau.yaml: ship it in the project folder or as a file the run reads",
            )])
            return
        try:
            req = ev.payload(SubmitRequested)
        except (
            Exception
        ) as exc:  # malformed payload: reject the run with the reason, don't poison the consumer
            await self._reject(
                ev,
                [
                    Issue(
                        field="payload",
                        message=f"malformed submission: {exc}",
                        fix="publish a SubmitRequested JSON body (see docs/architecture.md)",
                    )
                ],
            )
            return
        # read once per submission: the signer and the rate limit; its mark goes on to the policy (``platform_mark``)
        platform, platform_mark = await platform_read
        try:
            user, signer = await self.signers.identify_on(ev, platform)
        except Refused as refused:
            await self._reject(ev, [refused.issue])
            return
        workspace = req.workspace or ev.workspace
        if token(workspace) != ev.nats_subject.split(".")[1]:
            await self._reject(ev, [Issue(
                field="workspace", message=f"the signed submission names workspace {workspace!r}, but was "
                f"published on {ev.nats_subject}", fix="publish on run.<workspace>.<run>.submit.requested",
            )], user=user)
            return
        if await kv.create(self.bus, "submissions", req.submission_id, ev.subject.encode(),
                           ttl=SUBMISSION_ID_TTL_S) is None:
            if (reused := await self._another_runs_submission(ev, req)) is not None:
                await self._reject(ev, [reused], user=user)
                return
            record, _ = await runrecord.get_for(self.bus, ev)
            if record is not None and record.state not in ("new", "submitted"):
                return  # a repeated submission: the run already exists and moved on
            wait = await self.pacer.due(req.submission_id)  # a paced submission back for its slot
        else:
            limit = _rate_limit(platform, workspace)
            try:
                wait = await self.pacer.reserve(workspace, req.submission_id, per_minute=limit,
                                                seq=ev.seq if workspace == ev.workspace else 0)
                await self.pacer.leave(ev.workspace, ev.seq)
            except ratelimit.Backlogged as full:
                await self._reject(ev, [Issue(
                    field="workspace",
                    message=f"workspace {workspace!r} admits {limit} new submissions a minute and already has "
                            f"{full.ahead} waiting their turn, the most it may have; this one was not queued",
                    fix="submit the rest once those are accepted, or ask a platform admin to raise "
                        "workspaces[].submissions_per_minute in platform.yaml",
                )], user=user)
                return
        if wait > 0:  # over the workspace's rate: it waits in the stream, in order, and is admitted at its slot
            raise NotYet(f"paced: workspace {workspace!r} is over its submission rate; this one is admitted in "
                         f"{wait:.1f}s", delay=wait)
        try:
            cfg, parse = parsed(req.config_text, req.config_path)
        except ConfigError as err:
            await self._reject(ev, issues_of(err, file=req.config_path), message=str(err), user=user)
            return
        source_issue = await self._check_source(req)
        if source_issue is not None:
            await self._reject(ev, [source_issue], user=user)
            return
        await self.bus.emit(
            workspace=workspace,
            run_id=ev.subject,
            attempt=1,
            event_type="submit.accepted",
            user=user,
            lane=_lane(cfg, platform, workspace),
            payload=SubmitAccepted(
                submission_id=req.submission_id,
                config=parse.config,
                # no config_hash: the policy hashes the parse it resolves, the same value (~80 B a run, issue 27)
                # no config_lines: only a refusal reads them, and the policy then reads them back from this
                # request's text (services/policy/keylines.py), ~290 B more of every run in RUNS (issue 27)
                config_managed=parse.managed,
                # no config_text: the evidence seals the text from this very request (the first stored one,
                # the only one answered), so a copy here was the config once more in RUNS and AUDIT (issue 27)
                config_path=req.config_path,
                source_object=req.source_object,
                source_digest=req.source_digest,
                user=user,
                resume_from=req.resume_from,
                resumes=req.resumes,
                retries=req.retries,
                reproduces=req.reproduces,
                platform_revision=req.platform_revision,
                python=req.python,
                python_source=req.python_source,
                signer=signer,
                platform_mark=platform_mark,
                # no signature: it is the request's own (its tau-signature header, which the evidence seals from
                # the request this answers), ~100 B more of every run in RUNS that nothing read (issue 27)
            ),
        )

    async def _another_runs_submission(self, ev: Event, req: SubmitRequested) -> Issue | None:
        """Why ``req``'s submission id, claimed already, is not this run's to repeat. A submission id names one
        run, but the run id is the subject's: another run's id taken again (one's own, or another workspace's),
        admitted as a repeat, would skip the workspace's rate, and the pacer's slot is the id's."""
        held = await kv.get(self.bus, "submissions", req.submission_id)
        if held is None or held.value == ev.subject.encode():
            return None
        return Issue(field="submission_id",
                     message=f"submission id {req.submission_id!r} is the submission of run "
                             f"{held.value.decode(errors='replace')}, not of {ev.subject}",
                     fix="submit without --submission-id (`tau run` picks a new one), or with an id not used in "
                         "the last 24 hours; the same id with the same job name always yields the same run")

    async def _first_for_run(self, ev: Event) -> bool:
        """Whether this message (by its stream sequence, the same on every redelivery) is the first request
        stored for its run, the only one the submitter answers. Anyone who may submit in a workspace can
        publish on any run's subject there, signed or not, or replay an old request; answering such a
        request (a rejection, say) would write into someone else's run. Run and workspace are the subject's.

        A run id names one run on the whole platform, too: evidence objects (``runs/<run>/…``), the archive and
        the services' wildcard reads (``run.*.<run>``) key by it alone. Run ids are visible to every person, so a
        researcher submitting in her workspace under a colleague's run id would have her run's seal replace the
        colleague's bundle. The first workspace to claim the id keeps it; a request of another workspace is
        dead-lettered unanswered (an answer would be sealed under the same names).

        One create-once key claims both (issue 27: two keys a run before, ~145 B): ``id.<run>`` → ``<ws>:<seq>``,
        the workspace that first submitted the run id and its first stored request's sequence (the policy's key
        lines read it back, ``keylines.py``). An earlier release's ``id.<run>`` holds the workspace alone, the
        sequence in ``run.<ws>.<run>`` (``_first_by_run_key``)."""
        key = f"id.{ev.subject}"
        # The three reads at once (one round trip, not three in a row: issue 30's idle latency): a new run, the
        # usual request, needs all of them, and a repeat only reads two keys it does not use.
        held, newest, earlier = await asyncio.gather(
            kv.get(self.bus, "submissions", key),
            # A run submitted before runs claimed their ids holds it by its record alone. The newest record of the
            # id is enough (one direct get, not a stream-info request: issue 30): this workspace's own, when there
            # is one, was opened only where no other workspace's was found first (the projection's ``_may_open``,
            # or this stage's answer).
            kv.newest_key(self.bus, "run_state", f"run.*.{ev.subject}"),
            # A run an earlier release claimed before run ids were claimed keeps its first request's sequence in
            # ``run.<ws>.<run>``: that request stays the only one answered (a replayed one is not).
            kv.get(self.bus, "submissions", f"run.{ev.workspace}.{ev.subject}"))
        if held is None:
            # The claim is written for its owner, found first: a claim written for this workspace and then refused
            # would let the same request through when it is handled again (a redelivery after a crash or a failed
            # listing).
            other = newest.split(".")[1] if newest is not None else ev.workspace
            first = earlier.value if earlier is not None and earlier.value.isdigit() else str(ev.seq).encode()
            claim = other.encode() if other != ev.workspace else ev.workspace.encode() + b":" + first
            if await kv.create(self.bus, "submissions", key, claim) is None:
                held = await kv.get(self.bus, "submissions", key)  # another replica claimed it meanwhile
            value = claim if held is None else held.value or b""
        else:
            value = held.value or b""
        text = value.decode(errors="replace")
        theirs, seq = run_claim(text)
        if theirs != ev.workspace:
            raise PermanentError(
                f"run id {ev.subject} belongs to a run of workspace {theirs}: a run of workspace {ev.workspace} "
                "under the same id is refused unanswered; submit it again (`tau run` picks a new id)")
        if seq is not None:
            return seq == str(ev.seq)
        return await self._first_by_run_key(ev)

    async def _first_by_run_key(self, ev: Event) -> bool:
        """``_first_for_run`` for a run whose id an earlier release claimed (its workspace alone): that release
        kept the first request's sequence in ``run.<ws>.<run>``."""
        claim, mine = f"run.{ev.workspace}.{ev.subject}", str(ev.seq).encode()
        if await kv.create(self.bus, "submissions", claim, mine) is None:
            held = await kv.get(self.bus, "submissions", claim)
            if held is None or held.value != mine:
                return False
        return True

    async def _check_source(self, req: SubmitRequested) -> Issue | None:
        """A submission's snapshot must be in the store under its content address and hash to it (a
        ``TemporaryError`` when the store cannot answer: the submission waits)."""
        if not req.source_object and not req.source_digest:
            return None
        fix = "submit again with `tau run` (it uploads the snapshot under its digest)"
        try:
            await snapshots.promote(self.bus, req.source_object, req.source_digest, max_bytes=SNAPSHOT_UPLOAD_MAX_BYTES)
        except snapshots.SourceMismatch as bad:
            return Issue(field="source_object", message=str(bad), fix=fix)
        except NotFound:
            return Issue(field="source_object", message=f"source snapshot {req.source_object} was not "
                         "uploaded", fix=fix)
        return None

    async def _reject(self, ev: Event, reasons: list[Issue], message: str = "", user: str = "") -> None:
        """``user`` is the verified submitter when the signature checked out, else empty."""
        await self.bus.emit(
            workspace=ev.workspace,
            run_id=ev.subject,
            attempt=1,
            event_type="submit.rejected",
            payload=Rejected(reasons=reasons, message=message or reasons[0].message),
            user=user,
        )
