"""Client operations over NATS only: submit, status, list, cancel, events (replay and follow), logs.

The client parses a tau.yaml before it submits, for the person at the keyboard: problems come back at once with
their line and fix, the project is checked and its snapshot shipped, and a lane is claimed. That parse is not the
record: the submitter parses the text it is sent again and alone decides (``submit.accepted`` carries its parse,
which every later stage reads), so a client that skips or fakes this step changes nothing downstream."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime as dt
import getpass
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from taugrid.bus import identity, replay, tracing
from taugrid.bus.connection import Bus, connect
from taugrid.bus.envelope import Event, run_traceparent
from taugrid.bus.replay import ReplayCursor
from taugrid.core.contracts import CancelDecision, CancelRequested, LogChunk, SubmitRequested
from taugrid.core.errors import ConfigError, NotFound, PermanentError, PermissionDenied
from taugrid.core.events import TERMINAL_EVENTS, message_id
from taugrid.core.ids import new_run_id, new_submission_id, token
from taugrid.core.states import RunRecord

if TYPE_CHECKING:
    from taugrid.bus.platformread import PlatformReader
    from taugrid.client import platformplan
    from taugrid.client.again import Again
    from taugrid.config.platform import Platform
    from taugrid.config.taujob import TauConfig

# Reading (status, list, events) is what most commands and scripts do, so the modules only submitting and the
# platform need (the run-config and platform models, pydantic; the project snapshot; the run record's
# projection) are imported where they are used: `tau events` starts without them (docs §13 "Replay").

LANE_PLATFORM_S = 5.0  # how long the platform read for a lane claim is reused (a sweep submits many runs at once)
POD_END_HOLD_S = 5.0  # the longest an attempt's end waits in the console for its log lines to be read


class CancelRefused(PermanentError):
    """The renderer refused a cancel (bad signature, or not the run's submitter or a workspace admin)."""

    def __init__(self, message: str, decision: CancelDecision) -> None:
        super().__init__(message)
        self.decision = decision


def _parsed_or_none(text: str, path: str) -> TauConfig | None:
    """The config for a lane claim; None when it does not parse (the submitter rejects it with the reason)."""
    from taugrid.config.taujob import load_tau_config_shared

    try:
        return load_tau_config_shared(text, path=path)
    except ConfigError:
        return None


class Client:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._workspaces: dict[str, str] = {}  # run id → workspace, for runs this client submitted or read
        self._readable: tuple[list[str] | None] | None = None  # cached ``readable_workspaces``
        self._platform_reader: PlatformReader | None = None
        self._platform: tuple[float, Platform | None] | None = None  # (read at, platform) for lane claims

    @property
    def _platforms(self) -> PlatformReader:
        if self._platform_reader is None:
            from taugrid.bus.platformread import PlatformReader

            self._platform_reader = PlatformReader(self.bus)
        return self._platform_reader

    async def close(self) -> None:
        # every publish and KV write already awaited its ack; a drain would wait on subscriptions whose reader
        # stopped early (`tau events | head`), so close at once
        await self.bus.close(drain=False)

    # ---------------------------------------------------------------- submission
    async def submit(
        self,
        config_path: Path,
        *,
        workspace: str | None = None,
        submission_id: str | None = None,
        config: TauConfig | None = None,
        config_text: str | None = None,
    ) -> str:
        """Publish ``submit.requested`` and return the run id (known before any service answers).

        ``config_text`` submits that config instead of the file's (a sweep driver's variant of it); the
        project snapshot is still ``config_path``'s folder."""
        from taugrid.config.taujob import load_tau_config

        text = config_text if config_text is not None else config_path.read_text()
        cfg = config or load_tau_config(text, path=str(config_path))  # fast errors here; the submitter's is the record
        ws = workspace or (cfg.policy.workspace if cfg.policy and cfg.policy.workspace else "")
        ws = ws or await self._namespace_workspace(cfg) or "default"
        await self._refuse_outsider(ws)
        sid = submission_id or new_submission_id()
        run_id = new_run_id(cfg.name or "", sid)  # no name: "run-<hex>"
        req = msgspec.structs.replace(await self._project_request(config_path, text, cfg), submission_id=sid,
                                      workspace=ws)
        # outside a trace of the caller's, the run's derived one: its events then store no traceparent (issue 27)
        with tracing.span("tau run", attributes={"taugrid.run_id": run_id}, root=run_traceparent(run_id)):
            await self.bus.emit(
                workspace=ws, run_id=run_id, attempt=1, event_type="submit.requested", payload=req,
                lane=await self.lane(cfg, ws),
            )
        self._workspaces[run_id] = ws
        return run_id

    async def _refuse_outsider(self, workspace: str) -> None:
        """A person submitting into a workspace they are not a member of is told so in one sentence, before the
        bus refuses the publish (which would only say which subject it refused)."""
        from taugrid.client.access import viewer

        me = self.bus.identity
        person = await viewer(self.bus, me.public_key) if me is not None else None
        why = person.not_a_member(workspace) if person is not None else ""
        if why:
            raise PermissionDenied(why)

    async def _project_request(self, config_path: Path, text: str, cfg: TauConfig) -> SubmitRequested:
        """A submission of the project holding ``config_path`` as it is now (``text`` parsed as ``cfg``): its
        snapshot uploaded, its interpreter found; no submission id or workspace yet."""
        from taugrid.client.interpreter import submitting_python
        from taugrid.config.project import check_project, project_root
        from taugrid.config.source import raise_issues
        from taugrid.sources import snapshots
        from taugrid.sources.archive import snapshot, source_object

        raise_issues(check_project(cfg, config_path.parent.resolve()))
        excludes = list(cfg.run.working_dir_excludes or []) if cfg.run else []
        root, subdir = project_root(cfg, config_path.parent)
        data, digest = snapshot(root, extra_excludes=excludes)
        name = source_object(digest)
        await snapshots.upload(self.bus, name, data)  # skipped only when the stored object verifies
        python, python_source = submitting_python(config_path.parent.resolve())
        return SubmitRequested(
            submission_id="",
            config_text=text,
            # the config's folder inside the snapshot: policy runs the entrypoint from there
            config_path=f"{subdir}/{config_path.name}" if subdir else config_path.name,
            source_object=name,
            source_digest=digest,
            user=_user(),
            python=python,
            python_source=python_source,
        )

    async def submit_text(
        self,
        text: str,
        *,
        workspace: str = "default",
        path: str = "tau.yaml",
        submission_id: str | None = None,
        name: str = "run",
    ) -> str:
        """Submit raw config text with no project snapshot (what a non-Python client would publish)."""
        sid = submission_id or new_submission_id()
        run_id = new_run_id(name, sid)
        req = SubmitRequested(
            submission_id=sid, config_text=text, config_path=path, workspace=workspace, user=_user()
        )
        await self.bus.emit(
            workspace=workspace, run_id=run_id, attempt=1, event_type="submit.requested", payload=req,
            lane=await self.lane(_parsed_or_none(text, path), workspace),
        )
        self._workspaces[run_id] = workspace
        return run_id

    async def lane(self, cfg: TauConfig | None, workspace: str) -> str:
        """The priority lane to claim for a submission of ``cfg`` (``events.HIGH_LANE`` for a class the platform
        ranks above the workspace's default, else ""). Only a hint for the stages before admission: the submitter
        and the policy decide the lane again from the platform, and the policy alone the priority."""
        if cfg is None:
            return ""
        now = time.monotonic()
        if self._platform is None or now - self._platform[0] > LANE_PLATFORM_S:
            self._platform = (now, await self._platforms.get_or_none())
        platform = self._platform[1]
        from taugrid.config.resolve import lane_for  # deferred, as namespace_workspace: the CLI starts cold

        return lane_for(cfg, platform, workspace) if platform is not None else ""

    async def resume(
        self, run_id: str, *, checkpoint: str = "", force: bool = False, submission_id: str | None = None,
        project: Path | None = None,
    ) -> Again:
        """A new run from ``run_id``'s last checkpoint (or ``checkpoint``), with its config and code or with
        ``project``'s as they are now (``again.resume``)."""
        from taugrid.client import again

        return await again.resume(self, run_id, checkpoint=checkpoint, force=force, submission_id=submission_id,
                                  project=project)

    async def retry(self, run_id: str, *, submission_id: str | None = None, project: Path | None = None) -> Again:
        """A new run of the finished ``run_id`` from the start, with its config and code or with ``project``'s
        as they are now (``again.retry``)."""
        from taugrid.client import again

        return await again.retry(self, run_id, submission_id=submission_id, project=project)

    async def project_request(self, config_path: Path) -> tuple[SubmitRequested, TauConfig]:
        """A submission of the project at ``config_path`` as it is now (``_project_request``), and its config."""
        from taugrid.config.taujob import load_tau_config

        text = config_path.read_text()
        cfg = load_tau_config(text, path=str(config_path))
        return await self._project_request(config_path, text, cfg), cfg

    async def _workspace_still_there(self, record: RunRecord, command: str) -> None:
        """A run again goes to the old run's workspace: refuse at once when the platform no longer has it, rather
        than submit a run the policy can only reject after this command has exited 0."""
        platform = await self._platforms.get_or_none()
        if platform is None or platform.workspace(record.workspace) is not None:
            return
        known = ", ".join(w.name for w in platform.workspaces) or "none"
        raise NotFound(f"`{command}` of {record.run_id}: its workspace {record.workspace!r} is no longer in the "
                       f"platform (workspaces: {known}); restore it with `tau platform apply`, or submit the project "
                       "again into another workspace with `tau run PROJECT --workspace NAME`")

    async def submit_request(self, req: SubmitRequested, *, workspace: str, name: str, span: str,
                             submission_id: str | None = None) -> str:
        """Submit a prepared request (a run again, or one rebuilt from sealed evidence) as a new run of this
        person under a new submission id; returns the new run id."""
        sid = submission_id or new_submission_id()
        new_id = new_run_id(name, sid)
        req = msgspec.structs.replace(req, submission_id=sid, workspace=workspace, user=_user())
        with tracing.span(span, attributes={"taugrid.run_id": new_id}, root=run_traceparent(new_id)):
            await self.bus.emit(workspace=workspace, run_id=new_id, attempt=1, event_type="submit.requested",
                                payload=req, lane=await self.lane(_parsed_or_none(req.config_text, req.config_path),
                                                                  workspace))
        self._workspaces[new_id] = workspace
        return new_id

    async def cancel(self, run_id: str, *, reason: str = "cancelled by user", wait_s: float = 20.0,
                     workspace: str | None = None, delegation: str = "") -> CancelDecision | None:
        """Ask to cancel ``run_id`` (a signed request) and wait for the renderer's answer. Returns the
        ``cancel.accepted`` decision, None when the run had already finished or no answer came within
        ``wait_s``; raises ``CancelRefused`` with the reason when the renderer refused. A service acting for a
        person (the portal) passes the person's ``delegation`` token; the request then counts as theirs."""
        record = await self.status(run_id, workspace=workspace)
        if record.finished:
            return None
        nonce = uuid.uuid4().hex[:12]  # every request is its own event: a refused one must not hide the next
        await self.bus.emit(
            workspace=record.workspace,
            run_id=run_id,
            attempt=record.attempt,
            event_type="cancel.requested",
            payload=CancelRequested(reason=reason, requested_by=_user()),
            dedup=nonce, delegation=delegation, user="",  # a request carries its signer, not a ce-tauuser
        )
        request_id = message_id(run_id, record.attempt, "cancel.requested", suffix=nonce)
        try:
            return await asyncio.wait_for(self._cancel_answer(record.workspace, run_id, request_id),
                                          timeout=wait_s)
        except TimeoutError:
            return None

    async def _cancel_answer(self, workspace: str, run_id: str, request_id: str) -> CancelDecision:
        # Filtered on the run's own workspace: people may read only their workspaces' subjects.
        async for ev in self.replay(f"run.{token(workspace)}.{token(run_id)}.cancel.*", follow=True):
            if ev.type not in ("cancel.accepted", "cancel.refused"):
                continue
            decision = ev.payload(CancelDecision)
            if decision.request_id != request_id:
                continue
            if ev.type == "cancel.refused":
                raise CancelRefused(decision.reason, decision)
            return decision
        raise AssertionError("unreachable: a followed replay only ends when cancelled")

    # ---------------------------------------------------------------- reading
    async def readable_workspaces(self) -> list[str] | None:
        """The workspaces whose runs this connection may read: None for every workspace (a platform admin, the
        local stack's owner, or a bus without authentication), else the person's workspaces from the
        platform (the same list their bus permissions are rendered from)."""
        if self._readable is None:
            self._readable = (await self._find_readable(),)
        return self._readable[0]

    async def _find_readable(self) -> list[str] | None:
        from taugrid.client.access import viewer

        me = self.bus.identity
        if me is None:
            return None
        person = await viewer(self.bus, me.public_key)
        if person is None:
            return []
        return None if person.workspaces is None else list(person.workspaces)

    async def status(self, run_id: str, *, workspace: str | None = None) -> RunRecord:
        """The run's record; by id alone, it is looked for in the workspaces this connection may read."""
        from taugrid import runrecord

        ws = workspace or self._workspaces.get(run_id)
        if ws is not None:
            record, _ = await runrecord.get(self.bus, ws, run_id)
        else:
            record = await runrecord.find(self.bus, run_id, workspaces=await self.readable_workspaces())
        if record is None:  # "in your workspaces" only where there are others this person may not read
            where = " in your workspaces" if await self.readable_workspaces() is not None else ""
            raise NotFound(f"run {run_id} not found{where} (see `tau list`)")
        self._workspaces.setdefault(run_id, record.workspace)
        return record

    async def settled(self, run_id: str, *, timeout: float = 10.0) -> RunRecord:
        """The record once the projection has caught up with a finished run (or the latest after ``timeout``)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            record = await self.status(run_id)
            if record.finished or asyncio.get_running_loop().time() > deadline:
                return record
            await asyncio.sleep(0.1)

    async def workspace_of(self, run_id: str) -> str:
        """The run's workspace (people may read only their workspaces' subjects, so filters must name it);
        ``*`` when the run is not known yet, which only a platform admin may read."""
        if run_id in self._workspaces:
            return self._workspaces[run_id]
        from taugrid import runrecord

        record = await runrecord.find(self.bus, run_id, workspaces=await self.readable_workspaces())
        if record is None or not record.workspace:
            return "*"
        self._workspaces[run_id] = record.workspace
        return record.workspace

    async def _ws_filter(self, run_id: str) -> str:
        """The workspace token for a subject filter on ``run_id``'s events (``*`` when unknown)."""
        ws = await self.workspace_of(run_id)
        return "*" if ws == "*" else token(ws)

    async def list(self) -> list[RunRecord]:
        """The runs of the workspaces this connection may read (a person: only their own workspaces)."""
        from taugrid import runrecord

        records = await runrecord.list_records(self.bus, workspaces=await self.readable_workspaces())
        return sorted(records, key=lambda r: r.created)

    async def replay(
        self,
        subject: str,
        *,
        stream: str = "RUNS",
        since: dt.datetime | None = None,
        follow: bool = False,
        idle_timeout: float = 1.0,
        cursor: ReplayCursor | None = None,
    ) -> AsyncIterator[Event]:
        """Events on ``subject`` in stream order; with ``follow``, keep going with live ones. A ``cursor`` lets
        the caller ask whether everything stored so far has been yielded. RUNS (the default) is read from
        HISTORY and AUDIT, which keep a run's events after the stages have read them, merged in RUNS' order
        (``replay.follow``): ``subject`` is a filter on run events, ``run.<ws>.<run>.…``."""
        feed = replay.follow(self.bus, subject, stream=stream, since=since, live=follow, idle_timeout=idle_timeout,
                             cursor=cursor)
        async with contextlib.aclosing(feed):  # the consumer goes as soon as the caller stops reading
            async for ev in feed:
                yield ev

    async def events(
        self, *, run_id: str | None = None, since: dt.datetime | None = None, follow: bool = False
    ) -> AsyncIterator[Event]:
        subject = f"run.{await self._ws_filter(run_id)}.{token(run_id)}.>" if run_id else "run.>"
        if follow:
            async for ev in self.replay(subject, since=since, follow=True):
                yield ev
            return
        feed = replay.batches(self.bus, subject, since=since)  # the stored history: one generator between, not three
        async with contextlib.aclosing(feed):
            async for got in feed:
                for ev in got:
                    yield ev

    async def event_batches(
        self, *, run_id: str | None = None, since: dt.datetime | None = None, workspace: str | None = None
    ) -> AsyncIterator[builtins.list[Event]]:  # builtins: the method ``list`` shadows it in this body
        """The stored history (``events`` without ``follow``) a fetched batch at a time: the fast path for audits.
        ``workspace`` confines it to one workspace's runs (what a person may read)."""
        if run_id:
            subject = f"run.{await self._ws_filter(run_id)}.{token(run_id)}.>"
        else:
            subject = f"run.{token(workspace)}.>" if workspace else "run.>"
        feed = replay.batches(self.bus, subject, since=since)
        async with contextlib.aclosing(feed):
            async for got in feed:
                yield got

    async def follow(self, run_id: str) -> AsyncIterator[Event]:
        """Every event of a run from the start until its evidence is sealed (or it ends without one)."""
        terminal_seen = False
        ws = await self._ws_filter(run_id)
        async for ev in self.replay(f"run.{ws}.{token(run_id)}.>", follow=True):
            yield ev
            if ev.type == "evidence.sealed":
                return
            if ev.type in TERMINAL_EVENTS:
                terminal_seen = True
            if terminal_seen and ev.type not in TERMINAL_EVENTS:
                return

    async def console(self, run_id: str, *, linger: float = 1.0,
                      max_hold: float = POD_END_HOLD_S) -> AsyncIterator[Event | LogChunk]:
        """The run's events and its script's output (``LogChunk``s), interleaved as they arrive, from the start
        until the run is sealed; output that lands up to ``linger`` seconds after that still comes.

        The two streams are read by two consumers, so a pod's last lines could arrive after the event that says
        it ended. An attempt's end (``exec.succeeded/failed/cancelled``) and everything after it are therefore
        held until every log line stored by then has been yielded (at most ``max_hold`` seconds): the local
        cluster stores a pod's last lines before its end is reported, so they always come first."""
        ws = await self._ws_filter(run_id)
        cursor = ReplayCursor()
        output = self.replay(f"log.{ws}.{token(run_id)}.*", stream="LOGS", follow=True, cursor=cursor)
        async for item in _interleave(self.follow(run_id), output, linger=linger, hold=_ends_a_pod,
                                      caught_up=cursor.caught_up, max_hold=max_hold):
            yield item.payload(LogChunk) if item.type.startswith("log") else item

    async def logs(self, run_id: str, *, follow: bool = False) -> AsyncIterator[LogChunk]:
        """A run's output, every attempt in order; with ``follow``, until the run has finished."""
        record = await self.status(run_id)
        subject = f"log.{token(record.workspace)}.{token(run_id)}.*"
        if not follow:
            async for ev in self.replay(subject, stream="LOGS"):
                yield ev.payload(LogChunk)
            return
        output = self.replay(subject, stream="LOGS", follow=True)
        async for ev in _interleave(self._until_finished(run_id), output, linger=1.5):
            yield ev.payload(LogChunk)

    async def _until_finished(self, run_id: str) -> AsyncIterator[Event]:
        while not (await self.status(run_id)).finished:
            await asyncio.sleep(0.5)
        return
        yield  # an async generator that yields nothing: it only ends

    # ---------------------------------------------------------------- platform
    async def platform_apply(self, text: str, *, path: str = "platform.yaml",
                             prune: bool = False) -> tuple[platformplan.Plan, int]:
        """Merge ``text`` onto the stored platform and store it (``platformplan``): (what it changes, the new
        revision, or the current one when it changes nothing). An invalid text is refused before anything sees
        it; a dropped workspace with runs or members raises ``PlatformRefused`` unless ``prune``."""
        from taugrid.client import platformplan

        return await platformplan.apply(self.bus, text, path=path, prune=prune)

    async def platform_plan(self, text: str, *, path: str = "platform.yaml", prune: bool = False) -> platformplan.Plan:
        """What ``platform_apply`` would store and change, without writing."""
        from taugrid.client import platformplan

        return await platformplan.plan(self.bus, text, path=path, prune=prune)

    async def platform_put(self, text: str, *, path: str, revision: int) -> int:
        """Store ``text`` as it is if the platform is still at ``revision`` (``Conflict`` otherwise): an exact edit
        of what was read (``tau admin user``), not a merge."""
        from taugrid.bus import platformstore
        from taugrid.config.platform import load_platform

        load_platform(text, path=path)
        return await platformstore.put_text(self.bus, text, revision=revision)

    async def _namespace_workspace(self, cfg: TauConfig) -> str | None:
        """The workspace of ``policy.namespace`` when the config names only that (as policy resolves it)."""
        if not (cfg.policy and cfg.policy.namespace):
            return None
        got = await self.platform_get()
        if got is None:
            return None
        from taugrid.config.platform import load_platform
        from taugrid.config.resolve import namespace_workspace

        return namespace_workspace(cfg, load_platform(got[0]))

    async def platform_get(self) -> tuple[str, int] | None:
        from taugrid.bus import platformstore

        return await platformstore.get_text(self.bus)


_HOLD_POLL_S = 0.05
POD_END_EVENTS = frozenset({"exec.succeeded", "exec.failed", "exec.cancelled"})


def _ends_a_pod(ev: Event) -> bool:
    return ev.type in POD_END_EVENTS


async def _interleave(
    main: AsyncIterator[Event], other: AsyncIterator[Event], *, linger: float,
    hold: Callable[[Event], bool] | None = None, caught_up: Callable[[], Awaitable[bool]] | None = None,
    max_hold: float = POD_END_HOLD_S,
) -> AsyncIterator[Event]:
    """Items of both iterators as they arrive. Ends once ``main`` has ended and ``other`` has been quiet for
    ``linger`` seconds; both are closed on the way out (so no subscription outlives the connection).

    With ``hold``: a ``main`` item it picks, and every ``main`` item after it, wait until ``caught_up()`` says
    ``other`` has handed out everything stored so far (or ``max_hold`` seconds have passed); ``other``'s items
    keep flowing meanwhile."""
    queue: asyncio.Queue[tuple[bool, Event] | None] = asyncio.Queue()  # None: main has ended
    held: list[Event] = []
    held_since = 0.0

    async def pump(source: AsyncIterator[Event], *, is_main: bool) -> None:
        try:
            async for item in source:
                await queue.put((is_main, item))
        finally:
            await source.aclose()  # type: ignore[attr-defined]
        if is_main:
            await queue.put(None)

    tasks = [
        asyncio.create_task(pump(main, is_main=True)),
        asyncio.create_task(pump(other, is_main=False)),
    ]
    try:
        ended = False
        while True:
            for task in tasks:  # a failed pump (a lost connection) fails the caller, not silently
                failure = task.exception() if task.done() and not task.cancelled() else None
                if failure is not None:
                    raise failure
            if held and queue.empty() and caught_up is not None and (
                    time.monotonic() - held_since > max_hold or await caught_up()) and queue.empty():
                # (empty again: what ``other`` yielded while ``caught_up`` was asked goes out before the held items)
                for ev in held:
                    yield ev
                held.clear()
                continue
            try:
                wait = _HOLD_POLL_S if held else linger if ended else 0.5
                item = await asyncio.wait_for(queue.get(), timeout=wait)
            except TimeoutError:
                if ended and not held:
                    return
                continue
            if item is None:
                ended = True
                continue
            from_main, ev = item
            if from_main and hold is not None and caught_up is not None and (held or hold(ev)):
                if not held:
                    held_since = time.monotonic()
                held.append(ev)
                continue
            yield ev
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except OSError:
        return "unknown"


async def open_client(
    url: str | None = None, *, creds: Path | str | None = None, connect_timeout: float = 5.0,
    max_reconnect_attempts: int = 3, ca: Path | str | None = None,
) -> Client:
    """A client of the bus at ``url`` with ``creds`` and the TLS ``ca`` (by default, found as
    ``taugrid.client.locate`` says). It
    signs submissions and cancels with the same person's nkey (else ``identity.load_user_seed``). Its connection
    is quiet: a failure to connect is one ``TemporaryError``, not a warning per attempt."""
    from taugrid.client import locate

    tracing.setup("client")
    where = url or locate.bus_url()
    bus = await connect(
        where, name="client", connect_timeout=connect_timeout, max_reconnect_attempts=max_reconnect_attempts,
        quiet=True, creds=creds or locate.bus_creds(where), ca=ca or locate.bus_ca(where),
    )
    bus.seed = bus.identity.seed.encode() if bus.identity and bus.identity.seed else identity.load_user_seed()
    return Client(bus)


def __getattr__(name: str) -> object:
    if name == "Again":  # what ``resume`` and ``retry`` return, kept importable from here without loading it
        from taugrid.client.again import Again

        return Again
    raise AttributeError(f"module 'taugrid.client.client' has no attribute {name!r}")


__all__ = ["Again", "CancelRefused", "Client", "open_client"]
