"""The web portal in a real browser: Debian's headless Chromium, driven by Playwright, against the embedded stack.

A researcher signs in with the link `tau portal` prints for her key, watches her run wait in the queue behind a
run holding both GPUs, start, print its lines live and succeed, sees its evidence verify, cancels nothing she may
not, and is refused a run of a workspace she is not in. Chromium must be installed (`.ci/run` installs it): a
missing browser fails this test, it never skips. With ``TAU_PORTAL_SCREENSHOTS=DIR`` the main pages are saved
there (the PNGs under docs/ came from this test).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.e2e.conftest import Stack, write_project

CHROMIUM = os.environ.get("TAU_CHROMIUM", "/usr/bin/chromium")

# Records every change of the state badge and every log line count, with the state showing at that moment.
OBSERVER = """
window.__seen = [];
new MutationObserver(() => {
  const state = document.querySelector('#run-state .state');
  const logs = document.getElementById('logs');
  const entry = [state ? state.textContent : '', logs ? logs.textContent.split('\\n').filter(Boolean).length : 0];
  const last = window.__seen[window.__seen.length - 1];
  if (!last || last[0] !== entry[0] || last[1] !== entry[1]) window.__seen.push(entry);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""

STEPS = 6
SCRIPT = ("import os, time\n"
          f"for i in range({STEPS}):\n"
          "    print(f'step {i} loss {1 / (i + 1):.3f}', flush=True)\n"
          "    time.sleep(0.6)\n"
          "open(os.path.join(os.environ['TAU_OUTPUT_DIR'], 'metrics.jsonl'), 'w').write('{}\\n')\n"
          "os.makedirs(os.environ['TAU_CHECKPOINT_DIR'], exist_ok=True)\n"
          "open(os.path.join(os.environ['TAU_CHECKPOINT_DIR'], 'last.pt'), 'wb').write(b'0' * 2048)\n")
# At 1280 px nothing the eye scans breaks inside a word: the state badge and each event's name and time are one line.
# Each text node is judged alone: a cell holding a badge (padded, smaller type) is one line even though its
# pieces' boxes start at different heights.
ONE_LINE = """els => els.filter(e => {
  const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const text = document.createRange();
    text.selectNodeContents(n);
    if (n.textContent.trim() && new Set([...text.getClientRects()].map(r => Math.round(r.top))).size > 1) return true;
  }
  return false;
}).map(e => e.textContent)"""


def _as_person(stack: Stack, key: Path, *args: str) -> Any:
    env = {**stack.env, "TAU_NATS_CREDS": str(key)}  # her own bus identity and signing key
    import subprocess

    from tests.e2e.conftest import TAU

    proc = subprocess.run([*TAU, *args, "--output", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _get(url: str, token: str = "", *, wait_s: float = 60.0) -> tuple[int, Any]:
    """(status, JSON body); a portal not listening yet (still starting on a loaded machine) is waited for."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def people(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """petra (researcher in `default`) with her sign-in link, and a run of another workspace she may not read."""
    d = tmp_path_factory.mktemp("portal")
    stack.tau("admin", "user", "add", "petra", "--workspace", "default", "--out", str(d / "petra.nk"), check=True)
    link = _as_person(stack, d / "petra.nk", "portal")["sign_in_url"]
    other = write_project(d, "other", "print('not yours')\n", "name: other\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    theirs = stack.json("run", str(other.parent), "--workspace", "elsewhere")["run_id"]
    admin = stack.json("portal")["sign_in_url"]
    base = link.split("/login", 1)[0]
    admin_token = unquote(admin.split("token=", 1)[1])
    _until_state(base, admin_token, theirs, {"rejected", "succeeded", "failed"})
    return {"dir": d, "key": d / "petra.nk", "link": link, "token": unquote(link.split("token=", 1)[1]),
            "base": base, "theirs": theirs, "admin_token": admin_token}


def _until_state(base: str, token: str, run_id: str, states: set[str], timeout: float = 60) -> str:
    """Poll the portal's API (cheaper than a `tau status` process per look) until the run is in ``states``."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        status, body = _get(f"{base}/api/runs/{run_id}", token)
        state = body.get("state", "") if status == 200 else ""
        if state in states:
            return state
        time.sleep(0.2)
    raise AssertionError(f"{run_id} never reached {states}; last {state!r}")


def test_the_api_shows_a_person_only_her_workspaces(stack: Stack, people: dict[str, Any]) -> None:
    base, token = people["base"], people["token"]
    assert _get(f"{base}/api/runs")[0] == 401
    assert _get(f"{base}/api/runs", token + "x")[0] == 401
    assert _get(f"{base}/api/me", token)[1]["user"] == "petra"
    assert {r["workspace"] for r in _get(f"{base}/api/runs", token)[1]["runs"]} <= {"default"}
    status, body = _get(f"{base}/api/runs/{people['theirs']}", token)
    assert (status, body["error"]) == (404, f"run {people['theirs']} not found in your workspaces")
    assert _get(f"{base}/api/runs/{people['theirs']}/evidence", token)[0] == 404
    admin_runs = _get(f"{base}/api/runs?workspace=elsewhere&limit=500", people["admin_token"])[1]["runs"]
    # other tests on the session's stack run there too (test_people.py): the filter holds, the run is listed
    assert {r["workspace"] for r in admin_runs} == {"elsewhere"}
    assert people["theirs"] in [r["run_id"] for r in admin_runs]


def test_a_run_followed_in_the_browser_from_queued_to_verified(stack: Stack, people: dict[str, Any],
                                                               exchange: Path) -> None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.fail(f"chromium is not installed at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("TAU_PORTAL_SCREENSHOTS", people["dir"] / "shots"))
    shots.mkdir(parents=True, exist_ok=True)
    release = exchange / "release-blocker"  # the blocker holds both GPUs until the queue has been looked at
    blocker = write_project(people["dir"], "blocker", "import os, time\ndeadline = time.time() + 15\n"
                            f"while not os.path.exists({str(release)!r}) and time.time() < deadline:\n"
                            "    time.sleep(0.1)\n",
                            "name: blocker\nentrypoint: main.py\ncompute: {gpus: 2}\n")
    project = write_project(people["dir"], "train", SCRIPT, "name: train\nentrypoint: main.py\ncompute: {gpus: 1}\n")
    started = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.add_init_script(OBSERVER)  # the page is one document: it watches every view from the start
            page.goto(people["link"])  # sets the session cookie, lands on the runs page
            page.wait_for_selector("#runs table")
            assert page.inner_text("#me") == "petra · researcher · default"
            held = stack.json("run", str(blocker.parent), "--workspace", "default")["run_id"]
            _until_state(people["base"], people["admin_token"], held, {"admitted", "running"})
            run_id = _as_person(stack, people["key"], "run", str(project.parent), "--workspace", "default")["run_id"]
            # Opened once the run waits behind the blocker (before that, the page could first show `rendered`):
            # it then follows the run from queued on.
            _until_state(people["base"], people["admin_token"], run_id, {"queued"})
            page.goto(f"{people['base']}/#/runs/{run_id}")
            try:
                page.wait_for_selector("#run-state .state.queued", timeout=30_000)
            except Exception as exc:
                raise AssertionError(f"never queued: {page.evaluate('window.__seen')} {page.inner_text('main')}") \
                    from exc
            page.goto(f"{people['base']}/#/queues")
            page.wait_for_selector(f"#queues a[href='#/runs/{run_id}']")
            assert "#1" in page.inner_text("#queues")
            page.screenshot(path=str(shots / "portal-queues.png"), full_page=True)
            page.goto(f"{people['base']}/#/runs/{run_id}")
            page.wait_for_selector("#run-state .state.queued", timeout=30_000)
            release.touch()  # only now: the page is open on the run and follows it from queued on
            page.wait_for_selector("#run-state .state.succeeded", timeout=60_000)
            seen = [(s, n) for s, n in page.evaluate("window.__seen") if s]
            page.wait_for_selector("#verify", timeout=30_000)
            assert page.inner_text("#verify").startswith("✔ verified")
            logs = page.inner_text("#logs").splitlines()
            assert logs == [f"step {i} loss {1 / (i + 1):.3f}" for i in range(STEPS)]
            events = page.eval_on_selector_all("#events-box tr[data-type]", "rows => rows.map(r => r.dataset.type)")
            assert events.index("admission.queued") < events.index("exec.running") < events.index("exec.succeeded")
            assert events[-1] == "evidence.sealed"
            # the sealed outputs and checkpoints are listed on the run page
            page.wait_for_selector("#outputs tr[data-file='metrics.jsonl']", timeout=30_000)
            assert page.inner_text("#checkpoints-dir").startswith("checkpoints ")
            assert "last.pt\t2 KiB" in page.inner_text("#outputs")
            assert "checkpoints/last.pt" not in page.inner_text("#outputs")  # listed once, under checkpoints
            assert page.eval_on_selector_all(".state, #events-box td.nowrap, #pods td.nowrap", ONE_LINE) == []
            page.screenshot(path=str(shots / "portal-run.png"), full_page=True)

            states = [s for s, _ in seen]
            assert states[0] == "queued" and states[-1] == "succeeded" and "running" in states, seen
            # the lines came one by one while the run went on, not all at once at the end
            partial = [n for s, n in seen if s != "succeeded" and 0 < n < STEPS]
            assert len(partial) >= 2, f"the lines did not arrive live: {seen}"

            page.goto(f"{people['base']}/#/runs?user=petra")
            page.wait_for_selector(f"#runs a[href='#/runs/{run_id}']")
            assert "blocker" not in page.inner_text("#runs")  # filtered to petra's runs
            page.goto(f"{people['base']}/#/runs")
            page.wait_for_selector(f"#runs a[href='#/runs/{held}']")
            assert page.eval_on_selector_all("#runs td.nowrap, #runs th", ONE_LINE) == []  # ids, states, times
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # and no sideways scrolling
            page.screenshot(path=str(shots / "portal-runs.png"), full_page=True)
            page.goto(f"{people['base']}/#/nodes")
            page.wait_for_selector("#gpus td")
            assert "e2e-node" in page.inner_text("#nodes")
            page.screenshot(path=str(shots / "portal-nodes.png"), full_page=True)

            # a sign-in link that names a run lands on that run, not on the list
            fresh = browser.new_page(viewport={"width": 1280, "height": 900})
            deep = _as_person(stack, people["key"], "portal", "--run", run_id)["sign_in_url"]
            assert deep.endswith(f"#/runs/{run_id}")
            fresh.goto(deep)
            fresh.wait_for_selector("#run-state .state.succeeded", timeout=30_000)
            assert fresh.url.endswith(f"/#/runs/{run_id}")
            fresh.close()

            page.goto(f"{people['base']}/#/runs/{people['theirs']}")
            page.wait_for_selector("#error:not([hidden])")
            assert page.inner_text("#error") == f"run {people['theirs']} not found in your workspaces"
            assert people["theirs"] not in page.inner_text("#view")
        finally:
            browser.close()
    assert time.monotonic() - started < 90
