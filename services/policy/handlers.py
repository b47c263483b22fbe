"""Policy resolution. Idempotent: the same config and platform revision resolve to the same spec, published
with a deterministic message id; the platform is read per event as of the request: the submitter's mark of the
platform bucket, asked after the request was stored, rides in ``submit.accepted`` and is asked again only when this
reader holds its platform under another (``PlatformReader.get(vouched=…)``), so an apply that returned before a
request binds it.

Authorization the bus cannot express: on a platform that lists users, the submission's verified user (stamped
by the submitter) must be a member of the workspace; the priority class must be one the workspace allows
(``resolve_run``).

The config: resolved from the submitter's parse on ``submit.accepted`` (``config.accepted.rebuild``), which only
the submitter may publish (the consumer checks its ``ce-source`` and signature first); no text is parsed on the
way to a decision. Only a refusal reads the request's text back, for the line of each key it names (``keylines``).

Priority lanes: ``submit.accepted`` arrives on the default durable or the high lane's (``policy-high``); the
resolved priority alone decides the lane of ``policy.approved`` (``Platform.high_lane``)."""

from __future__ import annotations

import functools
import posixpath

import msgspec

from taugrid import runrecord
from taugrid.access.signers import Signers
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config import accepted
from taugrid.config.platform import Platform
from taugrid.config.resolve import resolve_run, resume_point
from taugrid.config.taujob import config_hash
from taugrid.core.contracts import Issue, PolicyApproved, Rejected, ResolvedRun, SubmitAccepted, issues_of
from taugrid.core.errors import ConfigError, TemporaryError
from taugrid.core.events import HIGH_LANE
from taugrid_services.policy import keylines


class Policy:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.signers = Signers(bus)  # the stack's local admin belongs to every workspace
        self.reader = self.signers.reader  # one reader: each revision fetched and parsed once in this process

    async def platform(self, vouched: str = "") -> tuple[Platform, int]:
        """The newest platform revision that validates (an invalid one is never acted on); a
        ``TemporaryError`` while there is none, so the run waits for the fix instead of dying here. ``vouched``:
        the mark the submitter asked after the request was stored (``PlatformReader.get``)."""
        got = await self.reader.get(vouched=vouched)
        if got is None:
            raise TemporaryError(
                "no platform policy applied yet (run `tau platform apply` or `tau up`)", delay=2.0
            )
        return got

    async def on_accepted(self, ev: Event) -> None:
        try:
            acc = ev.payload(SubmitAccepted)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"malformed submit.accepted: {exc}") from exc
        if not acc.config_hash:  # since issue 27 the policy hashes the parse it resolves (an earlier release's says it)
            acc = msgspec.structs.replace(acc, config_hash=_config_hash(
                msgspec.json.encode(acc.config, order="sorted"), acc.config_managed))
        # as fresh as the submitter's read, made after the request was stored: an apply that returned before the
        # request binds it, and the mark is asked again only when this reader holds another one
        platform, revision = await self.platform(acc.platform_mark)
        if (not await self.signers.is_local_admin(acc.signer)
                and (problem := _not_member(platform, acc.user, ev.workspace)) is not None):
            await self._reject(ev, [problem])  # membership by the platform as of the request, never a pinned one
            return
        if acc.platform_revision:  # `tau reproduce`: resolve exactly as the original run was
            if (problem := await self._not_a_reproduction(ev, acc)) is not None:
                await self._reject(ev, [problem])
                return
            pinned = await self.reader.at(acc.platform_revision)
            if not isinstance(pinned, Platform):
                why = "is no longer kept (the platform bucket keeps 64 revisions)" if pinned is None else (
                    f"does not validate: {str(pinned).splitlines()[0]}")
                await self._reject(ev, [Issue(
                    "platform_revision", f"platform revision {acc.platform_revision} {why}",
                    "run it against the current platform instead: `tau run retry RUN`")])
                return
            platform, revision = pinned, acc.platform_revision
        try:
            run = _resolve(ev, acc, platform, revision, acc.config_lines)
        except ConfigError as err:
            refusal = err
            if not acc.config_lines:  # only a refusal names lines: read them back from the request's text
                lines = await keylines.of_request(self.bus, ev, acc)
                try:
                    _resolve(ev, acc, platform, revision, lines)
                except ConfigError as placed:  # the same refusal (lines only choose fields and lines), placed
                    refusal = placed
            await self._reject(ev, issues_of(refusal), message=str(refusal))
            return
        if acc.python:  # the submitting environment's interpreter: the local backend runs `python` with it
            run = msgspec.structs.replace(run, python=acc.python, python_source=acc.python_source)
        if acc.resume_from:  # a manual resume: start from the given checkpoint, and retries resume from there too
            ws = platform.workspace(run.workspace)
            if ws is None:  # resolve_run refuses an unknown workspace: never reached, and never unchecked
                raise TemporaryError(f"workspace {run.workspace!r} of run {ev.subject} vanished from the platform")
            point, problem = resume_point(acc.resume_from, ws)
            if problem is not None:
                await self._reject(ev, [problem])
                return
            run = msgspec.structs.replace(
                run, env={**run.env, "TAU_RESUME_FROM": point},
                resilience=msgspec.structs.replace(run.resilience, checkpoint_path=point),
            )
        await self.bus.emit(
            workspace=ev.workspace,
            run_id=ev.subject,
            attempt=1,
            event_type="policy.approved",
            payload=PolicyApproved(run=run, platform_revision=revision),  # stored once, in run (wire_derived)
            # the real priority decides the renderer's lane, whatever lane the submission came on
            lane=HIGH_LANE if platform.high_lane(run.workspace, run.priority_class) else "",
        )

    async def _not_a_reproduction(self, ev: Event, acc: SubmitAccepted) -> Issue | None:
        """Why a submission may not pin ``acc.platform_revision``: only a reproduction may, of a run of the same
        workspace that was resolved against that revision from the same config. The body is the submitter's to
        write, and an older revision may have allowed what the current one does not (a priority class, an image,
        a larger run): pinned freely, it resolved a new config under a policy since withdrawn."""
        if not acc.config_hash:
            return None  # a config this version does not rebuild: resolving it refuses it, naming why
        original = None
        if acc.reproduces:
            original, _ = await runrecord.get(self.bus, ev.workspace, acc.reproduces)
        resolved = original.resolved if original is not None else None
        if resolved is not None and resolved.platform_revision == acc.platform_revision \
                and resolved.config_hash == acc.config_hash:
            return None
        named = f"; {acc.reproduces} is not one" if acc.reproduces else " (no run named)"
        return Issue("platform_revision",
                     f"platform revision {acc.platform_revision} is pinned only to reproduce a run of workspace "
                     f"{ev.workspace} resolved against it from the same config{named}",
                     "submit without platform_revision (the current platform applies), or `tau reproduce RUN`")

    async def _reject(self, ev: Event, reasons: list[Issue], message: str = "") -> None:
        await self.bus.emit(
            workspace=ev.workspace,
            run_id=ev.subject,
            attempt=1,
            event_type="policy.rejected",
            payload=Rejected(reasons=reasons, message=message or reasons[0].message),
        )


@functools.lru_cache(maxsize=256)
def _config_hash(config: bytes, managed: bool) -> str:
    """``config_hash`` of the accepted parse ``config`` (its JSON, keys sorted): the hash the submitter's record
    gave, since the rebuilt model dumps as the parsed one did (``config/accepted``); "" when this version does not
    rebuild it (the resolution then refuses it). Memoised: a workspace submits the same few configs again and again
    (~0.1 ms a hash)."""
    try:
        return config_hash(accepted.rebuild(msgspec.json.decode(config), path="", lines=[], managed=managed))
    except ConfigError:
        return ""


def _resolve(ev: Event, acc: SubmitAccepted, platform: Platform, revision: int,
             lines: list[accepted.KeyLine]) -> ResolvedRun:
    """The run ``acc`` resolves to (raises ``ConfigError``): the submitter's parse, not the text, since the submitter
    alone may publish submit.accepted. ``lines`` (each written key's line) change only which field and line a
    refusal names, never whether it resolves: ``keylines``."""
    cfg = accepted.rebuild(acc.config, path=acc.config_path, lines=lines, managed=acc.config_managed)
    return resolve_run(
        cfg,
        platform,
        run_id=ev.subject,
        submission_id=acc.submission_id,
        workspace=ev.workspace or None,
        platform_revision=revision,
        config_hash=acc.config_hash,
        source_object=acc.source_object,
        source_digest=acc.source_digest,
        user=acc.user,
        project_subdir=posixpath.dirname(acc.config_path),
    )


def _not_member(platform: Platform, user: str, workspace: str) -> Issue | None:
    """Why ``user`` may not submit into ``workspace`` (None when they may, or when the platform lists no
    users; an unknown workspace is left to ``resolve_run``, which names the known ones)."""
    if not platform.users or platform.workspace(workspace) is None:
        return None
    if user in platform.workspace_members(workspace):
        return None
    mine = ", ".join(platform.workspaces_of(user)) or "none"
    return Issue(field="policy.workspace",
                 message=f"user {user or '(unverified)'!r} is not a member of workspace {workspace!r}",
                 fix=f"submit to a workspace you belong to ({mine}), or ask its admin to add you to members")
