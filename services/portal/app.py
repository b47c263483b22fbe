"""The portal's HTTP side (aiohttp): a static single page and a JSON + server-sent-events API over the bus.

Routes (every ``/api`` route but ``/api/portal`` needs a session, see ``sessions``):
  GET  /login?token=…            check the token, set the session cookie, go to the page the link's
                                 fragment names (#/runs/X), else the runs page
  GET  /logout                   forget the cookie
  GET  /api/portal               this portal's public key (what ``tau portal --url`` signs a session for)
  GET  /api/me                   the signed-in person, their role and workspaces
  GET  /api/runs?state=&workspace=&user=&q=&limit=&cursor=   a page of runs, newest first, and the next cursor
  GET  /api/runs/{run}           the run record: state, phase tree, pods, history (a sealed run's: history_in evidence)
  GET  /api/runs/{run}/stream    server-sent events: the run's events and log lines as they are stored
  GET  /api/runs/{run}/evidence  the sealed bundle's summary and a fresh verify
  POST /api/runs/{run}/cancel    a cancel on the person's behalf (header ``X-Tau-Portal: 1``)
  GET  /api/queues · /api/nodes · /api/usage?by=&since=
A run the person may not read answers 404 exactly as one that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from taugrid.bus.connection import Bus
from taugrid.client import CancelRefused, Client
from taugrid.core.contracts import LogChunk
from taugrid.core.errors import NotFound, TauError
from taugrid_services.portal import reads
from taugrid_services.portal.sessions import COOKIE, NotSignedIn, Session, Sessions

log = logging.getLogger("taugrid.portal")
STATIC = Path(__file__).with_name("static")
HEARTBEAT_S = 10.0  # an idle stream sends a comment this often, so a closed tab is noticed
CSRF_HEADER = "X-Tau-Portal"  # a cross-site form cannot set it; a cross-site fetch would need CORS, never granted
SESSION = web.RequestKey("session", Session)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, fix: str = "") -> web.Response:
    return web.json_response({"error": message, "fix": fix}, status=status)


def build(bus: Bus, *, portal_key: str) -> web.Application:
    sessions = Sessions(bus, portal_key)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/api/") or request.path == "/api/portal":
            return await handler(request)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else request.cookies.get(COOKIE)
        if not token:
            return _error(401, "not signed in", "run `tau portal` and open the sign-in link it prints")
        try:
            request[SESSION] = await sessions.open(token)
        except NotSignedIn as exc:
            return _error(401, f"not signed in: {exc}", "run `tau portal` and open the sign-in link it prints")
        try:
            return await handler(request)
        except NotFound as exc:
            return _error(404, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))

    app = web.Application(middlewares=[guard])
    app["bus"] = bus
    routes = web.RouteTableDef()

    @routes.get("/")
    async def index(_: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @routes.get("/login")
    async def login(request: web.Request) -> web.StreamResponse:
        token = request.query.get("token", "")
        try:
            session = await sessions.open(token)
        except NotSignedIn as exc:
            return web.Response(status=401, content_type="text/html",
                                text=f"<h1>Sign-in refused</h1><p>{_html(str(exc))}</p>"
                                     "<p>Run <code>tau portal</code> for a new sign-in link.</p>")
        # no fragment here: the browser keeps the link's own (`/login?token=…#/runs/X` lands on run X), else the
        # page opens on the runs list
        response = web.HTTPSeeOther("/")
        max_age = max(1, int(session.expires - dt.datetime.now(dt.UTC).timestamp()))
        response.set_cookie(COOKIE, token, max_age=max_age, httponly=True, samesite="Strict", path="/",
                            secure=request.secure)
        raise response

    @routes.get("/logout")
    async def logout(_: web.Request) -> web.StreamResponse:
        response = web.HTTPSeeOther("/")
        response.del_cookie(COOKIE, path="/")
        raise response

    @routes.get("/api/portal")
    async def portal(_: web.Request) -> web.StreamResponse:
        return web.json_response({"delegate": portal_key})

    @routes.get("/api/me")
    async def me(request: web.Request) -> web.StreamResponse:
        v = request[SESSION].viewer
        return web.json_response({"user": v.name, "role": v.role, "key": v.public_key, "local": v.local,
                                  "workspaces": None if v.workspaces is None else list(v.workspaces),
                                  "expires": request[SESSION].expires})

    @routes.get("/api/runs")
    async def runs(request: web.Request) -> web.StreamResponse:
        return web.json_response(await reads.runs(bus, request[SESSION].viewer, dict(request.query)))

    @routes.get("/api/runs/{run}")
    async def run(request: web.Request) -> web.StreamResponse:
        record = await reads.run(bus, request[SESSION].viewer, request.match_info["run"])
        return web.json_response(reads.run_detail(record))

    @routes.get("/api/runs/{run}/evidence")
    async def evidence(request: web.Request) -> web.StreamResponse:
        record = await reads.run(bus, request[SESSION].viewer, request.match_info["run"])
        return web.json_response(await reads.evidence(bus, record))

    @routes.post("/api/runs/{run}/cancel")
    async def cancel(request: web.Request) -> web.StreamResponse:
        if request.headers.get(CSRF_HEADER) != "1":
            return _error(403, f"a cancel needs the {CSRF_HEADER} header (the portal's page sends it)")
        session = request[SESSION]
        record = await reads.run(bus, session.viewer, request.match_info["run"])
        try:
            decision = await Client(bus).cancel(record.run_id, workspace=record.workspace, delegation=session.token,
                                                reason=f"cancelled by {session.viewer.name} in the portal")
        except CancelRefused as exc:
            return _error(403, str(exc))
        if decision is None:
            return web.json_response({"cancelled": False, "message": "the run had already finished, or no answer "
                                                                      "came in time; see its state"})
        return web.json_response({"cancelled": True, "by": decision.by})

    @routes.get("/api/runs/{run}/stream")
    async def stream(request: web.Request) -> web.StreamResponse:
        record = await reads.run(bus, request[SESSION].viewer, request.match_info["run"])
        client = Client(bus)
        await client.status(record.run_id, workspace=record.workspace)  # pins the run's workspace for its filters
        return await _sse(request, _run_feed(client, record.run_id))

    @routes.get("/api/queues")
    async def queues(request: web.Request) -> web.StreamResponse:
        return web.json_response(await reads.queues(bus, request[SESSION].viewer))

    @routes.get("/api/nodes")
    async def nodes(request: web.Request) -> web.StreamResponse:
        return web.json_response(await reads.nodes(bus, request[SESSION].viewer))

    @routes.get("/api/usage")
    async def usage(request: web.Request) -> web.StreamResponse:
        by = request.query.get("by", "user")
        if by not in ("user", "workspace", "queue", "run"):
            return _error(400, f"by={by!r}: choose user, workspace, queue or run")
        since = _since(request.query.get("since", ""))
        return web.json_response(await reads.usage(bus, request[SESSION].viewer, by=by, since=since))

    routes.static("/static", STATIC)
    app.add_routes(routes)
    return app


async def _run_feed(client: Client, run_id: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The run's console (``Client.console``: events and log lines interleaved, until sealed) as SSE messages, one
    ``exec.progress`` line per change (``ProgressLines``), as ``tau run --follow`` prints them."""
    from taugrid.client.progresslines import ProgressLines
    from taugrid.client.summaries import event_detail

    progress = ProgressLines()
    async for item in client.console(run_id):
        if isinstance(item, LogChunk):
            yield "log", {"attempt": item.attempt, "pod": item.pod, "lines": item.lines}
            continue
        detail = event_detail(item)
        if not progress.repeats(item, detail):
            yield "run", {"seq": item.seq, "type": item.type, "time": item.time, "attempt": item.attempt,
                          "source": item.source, "detail": detail}
    yield "end", {}


async def _sse(request: web.Request, feed: AsyncIterator[tuple[str, dict[str, Any]]]) -> web.StreamResponse:
    """Send ``feed`` as server-sent events, with a heartbeat comment while it is quiet; stop when the browser goes."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    nxt: asyncio.Task[tuple[str, dict[str, Any]]] | None = None
    try:
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(anext(feed))
            done, _ = await asyncio.wait({nxt}, timeout=HEARTBEAT_S)
            if not done:
                await response.write(b": keep-alive\n\n")
                continue
            try:
                kind, data = nxt.result()
            except StopAsyncIteration:
                break
            except TauError as exc:
                await response.write(_message("error", {"error": str(exc)}))
                break
            nxt = None
            await response.write(_message(kind, data))
    except (ConnectionResetError, asyncio.CancelledError):
        log.debug("stream closed by the browser")
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
        await feed.aclose()  # type: ignore[attr-defined]
    return response


def _message(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n".encode()


def _since(text: str) -> dt.datetime | None:
    if not text:
        return None
    units = {"m": 60, "h": 3600, "d": 86400}
    if text[-1] in units and text[:-1].isdigit():
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(text[:-1]) * units[text[-1]])
    raise ValueError(f"since={text!r}: use a duration like 30m, 12h or 7d")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
