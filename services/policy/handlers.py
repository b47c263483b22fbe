"""Policy resolution. Idempotent: the same config and platform revision resolve to the same spec, published
with a deterministic message id; the platform is re-read per event so a new revision applies immediately."""

from __future__ import annotations

import msgspec
from taugrid.bus import platformstore
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config.platform import Platform, load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import load_tau_config_shared
from taugrid.core.contracts import PolicyApproved, Rejected, SubmitAccepted, issues_of
from taugrid.core.errors import ConfigError, TemporaryError


class Policy:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._cache: tuple[int, Platform] | None = None

    async def platform(self) -> tuple[Platform, int]:
        got = await platformstore.get_text(self.bus)
        if got is None:
            raise TemporaryError(
                "no platform policy applied yet (run `tau platform apply` or `tau up`)", delay=2.0
            )
        text, revision = got
        if self._cache is None or self._cache[0] != revision:
            self._cache = (revision, load_platform(text, path=f"platform.yaml@{revision}"))
        return self._cache[1], revision

    async def on_accepted(self, ev: Event) -> None:
        acc = ev.payload(SubmitAccepted)
        platform, revision = await self.platform()
        try:
            cfg = load_tau_config_shared(acc.config_text, path=acc.config_path)
            run = resolve_run(
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
            )
        except ConfigError as err:
            reasons = issues_of(err)
            await self.bus.emit(
                workspace=ev.workspace,
                run_id=ev.subject,
                attempt=1,
                event_type="policy.rejected",
                payload=Rejected(reasons=reasons, message=str(err)),
            )
            return
        if acc.python:  # the submitting environment's interpreter: the local backend runs `python` with it
            run = msgspec.structs.replace(run, python=acc.python, python_source=acc.python_source)
        if acc.resume_from:  # a manual resume: start from the given checkpoint (exported as TAU_RESUME_FROM)
            run = msgspec.structs.replace(
                run, resilience=msgspec.structs.replace(run.resilience, checkpoint_path=acc.resume_from)
            )
        await self.bus.emit(
            workspace=ev.workspace,
            run_id=ev.subject,
            attempt=1,
            event_type="policy.approved",
            payload=PolicyApproved(run=run, platform_revision=revision),
        )
