"""The portal's run page: a sign-in link that names a run (``/login?token=…#/runs/X``) lands on it, and a sealed
run's output and checkpoint files are listed as ``tau outputs`` lists them (issue 23 item 6)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import nkeys
from aiohttp.test_utils import TestClient, TestServer

from taugrid.access import delegation
from taugrid.bus import Bus, connect, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.identity import new_user_seed
from taugrid_services.portal.app import build
from taugrid_services.portal.reads import outputs

STATIC = Path(__file__).resolve().parents[2] / "services" / "portal" / "static"


async def test_sign_in_redirects_without_a_fragment_so_the_links_own_is_kept(
        fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    """A redirect without a fragment keeps the request's (RFC 9110 §10.2.2): the browser opens #/runs/X."""
    _, port, _ = fresh_nats
    bus: Bus = await connect(f"nats://127.0.0.1:{port}", name="test-portal-login")
    try:
        await bootstrap(bus)
        person = new_user_seed()
        await platformstore.put_local_user(bus, platformstore.LocalUser(
            name="owner", nkey=nkeys.from_seed(person).public_key.decode()))
        portal_key = nkeys.from_seed(new_user_seed()).public_key.decode()
        token = delegation.issue(person, delegate=portal_key, ttl_s=600)
        async with TestClient(TestServer(build(bus, portal_key=portal_key))) as client:
            response = await client.get("/login", params={"token": token}, allow_redirects=False)
            assert response.status == 303 and response.headers["Location"] == "/"
            assert "#" not in response.headers["Location"]
    finally:
        await bus.close()


def test_the_run_page_lists_outputs_and_checkpoints_apart() -> None:
    section = {
        "output_dir": {"path": "/o/ws/r1", "present": True, "truncated": False, "files": [
            {"path": "metrics.jsonl", "size": 2048, "sha256": "ab" * 32},
            {"path": "checkpoints/last.pt", "size": 200 << 20, "sha256": "cd" * 32}]},
        "checkpoint_dir": {"path": "/o/ws/r1/checkpoints", "present": True, "truncated": False, "files": [
            {"path": "last.pt", "size": 200 << 20, "sha256": "cd" * 32}]},
    }
    got = outputs(section)
    assert [f["path"] for f in got["output_dir"]["files"]] == ["metrics.jsonl"]  # the checkpoint is listed once
    assert [f["path"] for f in got["checkpoint_dir"]["files"]] == ["last.pt"]
    assert got["checkpoint_dir"]["path"] == "/o/ws/r1/checkpoints"
    assert outputs({})["output_dir"] == {"path": "", "present": False, "truncated": False, "files": []}
    page = (STATIC / "portal.js").read_text()
    assert 'id="outputs"' in page and "showOutputs(ev.outputs)" in page


def test_state_badges_and_event_names_never_break_mid_word() -> None:
    css = (STATIC / "portal.css").read_text()
    assert "white-space: nowrap" in css.split(".state {", 1)[1].split("}", 1)[0]
    assert "td.nowrap { white-space: nowrap; overflow-wrap: normal; }" in css.replace("th, td.nowrap", "td.nowrap")
    js = (STATIC / "portal.js").read_text()
    assert '<td class="nowrap">${esc(e.type)}</td>' in js
    # the runs list: a long run id and the submitted time stay on one line (the reason wraps, between words), and
    # the page takes the width of a 1280 px window (it was held to 1200 px, so the time broke before "PM")
    assert '<tr><td class="nowrap"><a href="#/runs/${encodeURIComponent(r.run_id)}">' in js
    assert '<td class="nowrap">${when(r.created)}</td>' in js
    assert "max-width: 1600px" in css.split("main {", 1)[1].split("}", 1)[0]


async def test_the_event_list_gets_one_progress_line_per_change() -> None:
    """A finished pod's status brings several exec.progress events that all read "started" (its phase, then its
    container's end): the portal's stream sends the line once per attempt and pod, as `tau run --follow` prints
    it (issue 23 item 6); every other event is sent as it came."""
    import msgspec

    from taugrid.bus.envelope import Event
    from taugrid.core.contracts import ExecProgress, PhaseReport
    from taugrid_services.portal.app import _run_feed

    def ev(i: int, kind: str, data: object, attempt: int = 1) -> Event:
        return Event(id=f"r1.{attempt}.{kind}.{i}", type=kind, source="/svc/admission-watcher", subject="r1",
                     time="2026-12-01T10:00:00Z", attempt=attempt, data=msgspec.json.encode(data))

    creating = ExecProgress(pod="r1-a1-pod", phases=[PhaseReport(name="container-start", status="active",
                                                                 detail="creating containers")])
    started = ExecProgress(pod="r1-a1-pod", pod_phase="Running", phases=[PhaseReport(name="running",
                                                                                     status="done")])
    ended = msgspec.structs.replace(started, pod_phase="Failed")
    again = msgspec.structs.replace(started, pod="r1-a2-pod")
    feed = [ev(0, "exec.progress", creating), ev(1, "exec.progress", started), ev(2, "exec.running", {"node": "vm"}),
            ev(3, "exec.progress", ended), ev(4, "exec.failed", {"reason": "Error"}),
            ev(5, "exec.progress", again, attempt=2), ev(6, "exec.progress", again, attempt=2)]

    class Console:
        async def console(self, run_id: str):  # type: ignore[no-untyped-def]
            for item in feed:
                yield item

    sent = [(data["type"], data["detail"]) async for kind, data in _run_feed(Console(), "r1")  # type: ignore[arg-type]
            if kind == "run"]
    assert sent == [("exec.progress", "r1-a1-pod: container-start active creating containers"),
                    ("exec.progress", "r1-a1-pod: started"), ("exec.running", "node=vm"),
                    ("exec.failed", "reason=Error"), ("exec.progress", "r1-a2-pod: started")]
