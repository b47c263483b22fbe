"""A run never holds the platform's keys (issue 22, item 3). As root, a researcher's run of workspace sec-a,
real processes started by the local kubelet, tries what eve's run did: read every key in ``creds/``, bob's
``secrets/sec-b.yaml``, a running sec-b run's ``/proc/<pid>/environ``, its pod directory and outputs, the bus's
store. Each is refused (``PermissionError``, errno 13) while the run still reads its own secret and writes its own
directories; through the local cluster a run of a per-workspace user still gets its project, a built environment,
its outputs, checkpoints and logs. The break-glass key is never under the data dir after ``tau up``'s setup, and an
anchor file re-signed with another key is refused by ``tau verify --anchor``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import pwd
import shutil
import stat
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nkeys
import pytest
from click.testing import CliRunner

from taugrid.bus import creds, platformstore
from taugrid.bus.topology import SOURCES_STORE
from taugrid.cli.evidence_cmd import verify
from taugrid.cli.stack import _operator_keys
from taugrid.core.contracts import BackendApply
from taugrid.evidence import anchor, bundle
from taugrid.local import objects, runas
from taugrid.local.containers import ENGINE_ANNOTATION
from taugrid.local.controller import LocalCluster
from taugrid.local.environment import EnvironmentBuilder
from taugrid.local.kubelet import Kubelet
from taugrid.local.ownenv import clean_pythons
from taugrid.local.podsync import PreparedRuntimes
from taugrid.local.runtime import Failed, PodRuntimes, Ready, RuntimeRequest
from taugrid.local.secrets import SecretStore, write_secret
from taugrid.stack import auth, localuser, operator
from taugrid.stack.scaling import SERVICES
from tests.inprocess import private_server
from tests.local.test_controller import PLATFORM
from tests.local.wheels import make_wheel

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                               reason="runs as per-workspace OS users need root and useradd (CI runs as root)")
A, B = "sec-a", "sec-b"  # workspaces; their runs run as tau-ws-sec-a and tau-ws-sec-b

ATTACK = """import os, sys
data, victim_pid, victim_pod, victim_out, own_out = sys.argv[1:6]
def attempt(label, action):
    try:
        action()
        print(label, "read")
    except OSError as exc:
        print(label, type(exc).__name__, exc.errno)
for name in sys.argv[6:]:
    attempt("creds/" + name, lambda: open(os.path.join(data, "creds", name)).read())
attempt("list creds/", lambda: os.listdir(os.path.join(data, "creds")))
attempt("secrets/sec-b.yaml", lambda: open(os.path.join(data, "secrets", "sec-b.yaml")).read())
attempt("secrets/sec-a.yaml", lambda: open(os.path.join(data, "secrets", "sec-a.yaml")).read())
attempt("victim environ", lambda: open(f"/proc/{victim_pid}/environ", "rb").read())
attempt("victim pod", lambda: os.listdir(os.path.join(data, "pods", victim_pod)))
attempt("victim outputs", lambda: os.listdir(victim_out))
attempt("bus store", lambda: os.listdir(os.path.join(data, "nats")))
attempt("list data dir", lambda: os.listdir(data))
attempt("list pods", lambda: os.listdir(os.path.join(data, "pods")))
print("own secret", os.environ["TOKEN"] == "tok-a-" + "x" * 24)
for where in (own_out, os.environ["HOME"], "."):
    with open(os.path.join(where, "mine.txt"), "w") as f:
        f.write("ok")
print("wrote own output, home and working directory")
print("uid", os.getuid() == os.geteuid() != 0, "groups", os.getgroups())
"""


def runnable_python(user: runas.RunUser) -> str:
    """An interpreter the workspace's user may run (this venv's may sit under root's 0700 home)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and not runas.cannot_reach(candidate, user, execute=True):
            return candidate
    pytest.skip("no Python interpreter here that an unprivileged user may run")
    raise AssertionError


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A stack's data dir where other users may pass (pytest's own temp folders are 0700 to them), laid out as
    the supervisor leaves it for per-workspace runs: keys, secrets and the bus's store closed."""
    d = Path(tempfile.mkdtemp(prefix="tau-isolation-", dir="/tmp"))
    try:
        auth.ensure_identities(d / "creds", SERVICES)
        auth.ensure_key(d / "creds" / "anchor.nk", "anchor")
        localuser.ensure_seed(d)
        (d / "nats" / "jetstream").mkdir(parents=True)
        runas.close_data_dir(d)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pod(name: str, workspace: str, command: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                         "labels": {"taugrid.io/workspace": workspace}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "ignored", "command": command, "env": env}]}}


def secret_env(name: str) -> list[dict[str, Any]]:
    return [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "token"}}}]


async def wait_running_pid(kubelet: Kubelet, name: str, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = kubelet.pods.state(name) or {}
        running = [c for c in state.get("containers", []) if "running" in c]
        if running:
            return int(running[0]["pid"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never ran: {kubelet.pods.state(name)}")


@ROOT_ONLY
async def test_a_run_reads_no_key_no_other_workspaces_secret_environ_pod_or_outputs(data_dir: Path) -> None:
    users = runas.WorkspaceUsers()
    write_secret(data_dir / "secrets", A, "hf", {"token": "tok-a-" + "x" * 24})
    b_token = f"tok-b-{uuid.uuid4().hex}"
    write_secret(data_dir / "secrets", B, "hf", {"token": b_token})
    kubelet = Kubelet(data_dir / "pods", resolve_secret=SecretStore(data_dir / "secrets").resolver(),
                      secret_scope=objects.workspace_of, claims_dir=data_dir / "claims", poll_s=0.05,
                      run_user=lambda p: users.user(objects.workspace_of(p)))
    victim_out = data_dir / "outputs" / B / "run-b"
    own_out = data_dir / "outputs" / A / "run-a"
    runas.make_private_dirs(victim_out, users.user(B))  # as the local cluster makes a run's output directory
    runas.make_private_dirs(own_out, users.user(A))
    (victim_out / "model.bin").write_bytes(b"bob's weights")
    victim = None
    try:
        victim = await kubelet.start(pod("victim-pod", B, ["/bin/sh", "-c", "sleep 60"], secret_env("hf")),
                                     lambda _s: None)
        victim_pid = await wait_running_pid(kubelet, "victim-pod")
        assert b_token.encode() in Path(f"/proc/{victim_pid}/environ").read_bytes()  # the right target, to root
        keys = sorted(p.name for p in (data_dir / "creds").iterdir() if p.suffix == ".nk")
        assert {"anchor.nk", "bootstrap.nk", "user.nk", "svc-local_cluster.nk"} <= set(keys)
        python = runnable_python(users.user(A))
        command = [python, "-c", ATTACK, str(data_dir), str(victim_pid), "victim-pod", str(victim_out),
                   str(own_out), *keys]
        handle = await kubelet.start(pod("attacker-pod", A, command, secret_env("hf")), lambda _s: None)
        final = await asyncio.wait_for(handle.wait(), 30)
        lines = [ln.text for ln in kubelet.read_log("attacker-pod", "main", final=True)[0]]
        denied = "PermissionError 13"
        assert lines[:-1] == [
            *(f"creds/{k} {denied}" for k in keys), f"list creds/ {denied}", f"secrets/sec-b.yaml {denied}",
            f"secrets/sec-a.yaml {denied}", f"victim environ {denied}", f"victim pod {denied}",
            f"victim outputs {denied}", f"bus store {denied}", f"list data dir {denied}", f"list pods {denied}",
            "own secret True", "wrote own output, home and working directory", "uid True groups []"]
        assert final["phase"] == "Succeeded", lines
        assert (own_out / "mine.txt").stat().st_uid == users.user(A).uid
        assert victim.status["phase"] == "Running"  # the victim's run went on, untouched
    finally:
        await kubelet.stop("victim-pod", grace_s=0)
        if victim is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(victim.wait(), 10)  # its shim gone before the data dir is removed
        await kubelet.close()


@ROOT_ONLY
async def test_through_the_local_cluster_a_workspace_users_run_gets_source_environment_outputs_and_logs(
        data_dir: Path, tmp_path: Path) -> None:
    users = runas.WorkspaceUsers()
    python = runnable_python(users.user(A))
    archive = io.BytesIO()
    wheel = make_wheel(tmp_path / "wheels")
    files = {"train.py": (b"import os, pathlib, tauprobe\n"
                          b"out, ckpt = pathlib.Path(os.environ['TAU_OUTPUT_DIR']), "
                          b"pathlib.Path(os.environ['TAU_CHECKPOINT_DIR'])\n"
                          b"(out / 'result.txt').write_text(open('hello.txt').read())\n"
                          b"(ckpt / 'step-1.pt').write_text('1')\n"
                          b"print('read', open('hello.txt').read().strip(), 'probe', tauprobe.VALUE, "
                          b"'as', os.environ['USER'])\n"),
             "hello.txt": b"hello\n", "requirements.txt": b"./wheels/tauprobe-1.0-py3-none-any.whl\n",
             "wheels/tauprobe-1.0-py3-none-any.whl": wheel.read_bytes()}
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    out = data_dir / "outputs" / A / "iso-run"
    async with private_server(data_dir / "bus-test") as (_url, bus):
        await platformstore.put_text(bus, PLATFORM)
        source = f"sources/{hashlib.sha256(archive.getvalue()).hexdigest()}.tar.gz"
        await (await bus.objects(SOURCES_STORE)).put(source, archive.getvalue())
        cluster = LocalCluster(bus, data_dir=data_dir, node="node-1", capacity={"cpu": 4.0, "memory": 8e9},
                               gpu_count=0, run_as=users,
                               runtime=PreparedRuntimes(PodRuntimes(data_dir, machine_pin=python), users))
        await cluster.load()
        env = [{"name": "TAU_OUTPUT_DIR", "value": str(out)},
               {"name": "TAU_CHECKPOINT_DIR", "value": str(out / "checkpoints")}]
        container = {"name": "main", "image": "python:3.11-slim", "command": ["python3", "train.py"],
                     "workingDir": "/tau/source", "env": env,
                     "volumeMounts": [{"name": "tau-source", "mountPath": "/tau/source"}],
                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "iso-run-a1", "namespace": "default",
                            "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": "iso-run",
                                       "taugrid.io/workspace": A, "taugrid.io/attempt": "1"}},
               "spec": {"suspend": True, "backoffLimit": 0, "completions": 1, "parallelism": 1,
                        "template": {"metadata": {"labels": {}}, "spec": {
                            "restartPolicy": "Never", "containers": [container],
                            "volumes": [{"name": "tau-source", "emptyDir": {}}]}}}}
        try:
            await cluster.apply(BackendApply(run_id="iso-run", workspace=A, attempt=1, manifests=[job],
                                             source_object=source))
            deadline = time.monotonic() + 120
            while "iso-run-a1" in cluster.wls and time.monotonic() < deadline:
                await cluster.tick()
                await asyncio.sleep(0.1)
            lines = [ln.text for ln in cluster.kubelet.read_log("iso-run-a1-pod", "main", final=True)[0]]
            assert lines == [f"read hello probe 42 as {users.user(A).name}"]
        finally:
            await cluster.kubelet.close()
    user = users.user(A)
    assert (out / "result.txt").read_text() == "hello\n"
    assert [(p.name, p.stat().st_uid, stat.S_IMODE(p.stat().st_mode)) for p in (out, out / "checkpoints")] == [
        ("iso-run", user.uid, 0o700), ("checkpoints", user.uid, 0o700)]
    assert (out / "checkpoints" / "step-1.pt").stat().st_uid == user.uid
    assert stat.S_IMODE((data_dir / "outputs" / A).stat().st_mode) == 0o711  # nobody lists a workspace's runs
    # the environment was built as the workspace's user (uv's cache is its own), in a folder of the workspace's
    # that the user can use but not change, and other workspaces cannot enter
    envs = data_dir / "envs" / user.name
    [env] = [p for p in envs.iterdir() if not p.name.startswith(".")]
    assert [(p.stat().st_uid, p.stat().st_gid, stat.S_IMODE(p.stat().st_mode)) for p in (envs, env)] == [
        (0, user.gid, 0o750), (user.uid, user.gid, 0o755)]
    assert (envs / ".home" / ".cache" / "uv").stat().st_uid == user.uid


@ROOT_ONLY
async def test_a_runs_termination_message_cannot_be_a_link_to_a_key(data_dir: Path) -> None:
    """The shim (root) reads the message back into the pod's status: a link there would publish any file."""
    users = runas.WorkspaceUsers()
    kubelet = Kubelet(data_dir / "pods", secret_scope=objects.workspace_of, claims_dir=data_dir / "claims",
                      poll_s=0.05, run_user=lambda p: users.user(objects.workspace_of(p)))
    key = data_dir / "creds" / "bootstrap.nk"
    script = (f"rm -f /dev/termination-log 2>/dev/null || echo cannot remove; "
              f'ln -s {key} "$(dirname /dev/termination-log)/x" 2>/dev/null || echo cannot link; '
              "printf done > /dev/termination-log")
    manifest = pod("final-words", A, ["/bin/sh", "-c", script], [])
    manifest["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    try:
        final = await asyncio.wait_for((await kubelet.start(manifest, lambda _s: None)).wait(), 30)
    finally:
        await kubelet.close()
    [status] = final["containerStatuses"]
    assert (status["state"]["terminated"]["message"], final["phase"]) == ("done", "Succeeded")
    assert [ln.text for ln in kubelet.read_log("final-words", "main", final=True)[0]] == [
        "cannot remove", "cannot link"]


@ROOT_ONLY
async def test_a_pod_run_through_a_container_engine_runs_its_container_as_the_workspaces_user(
        data_dir: Path) -> None:
    """The engine mounts the pod's directories and any existing directory a ``TAU_*`` variable names (a researcher
    may set TAU_RESUME_FROM): as root inside, the container could read creds/ through such a mount."""
    users = runas.WorkspaceUsers()
    kubelet = Kubelet(data_dir / "pods", secret_scope=objects.workspace_of, claims_dir=data_dir / "claims",
                      poll_s=0.05, run_user=lambda p: users.user(objects.workspace_of(p)))
    manifest = pod("boxed", A, ["python3", "-c", "print(1)"],
                   [{"name": "TAU_RESUME_FROM", "value": str(data_dir / "creds")}])
    manifest["metadata"]["annotations"] = {ENGINE_ANNOTATION: "/nonexistent/docker"}
    try:
        final = await asyncio.wait_for((await kubelet.start(manifest, lambda _s: None)).wait(), 30)
    finally:
        await kubelet.close()
    [container] = json.loads((kubelet.pods.dir("boxed") / "spec.json").read_text())["containers"]
    user = users.user(A)
    assert container["command"][:4] == ["/nonexistent/docker", "run", "--user", f"{user.uid}:{user.gid}"]
    assert f"{data_dir / 'creds'}:{data_dir / 'creds'}" in container["command"]  # mounted, but opened as the user
    assert (container["uid"], final["containerStatuses"][0]["state"]["terminated"]["reason"]) == (-1, "StartError")


@ROOT_ONLY
def test_root_gives_a_run_its_directories_without_following_a_link_the_run_left(tmp_path: Path) -> None:
    user = runas.RunUser("tau-ws-probe", 54321, 54321)  # chown needs no such OS user
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("root's")
    run_dir = tmp_path / "outputs" / "ws" / "run"
    runas.make_private_dirs(run_dir, user)
    assert [(p.stat().st_uid, stat.S_IMODE(p.stat().st_mode)) for p in (run_dir, run_dir.parent)] == [
        (54321, 0o700), (0, 0o711)]
    # an earlier attempt of the run (its user owns run_dir) put links where the next attempt's checkpoints go
    (run_dir / "checkpoints").symlink_to(outside)
    (run_dir / "deep").symlink_to(outside)
    for target in (run_dir / "checkpoints", run_dir / "deep" / "step"):
        with pytest.raises(OSError, match=f"in {target} is a link or not a directory, where tau-ws-probe may "
                                          "write: not followed"):
            runas.make_private_dirs(target, user)
    assert sorted(p.name for p in outside.iterdir()) == ["precious"] and outside.stat().st_uid == 0
    # a tree given once (the project placed as root) is walked by descriptors: a link in it is changed itself
    work = tmp_path / "pod" / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "train.py").write_text("print(1)")
    (work / "sub" / "leak").symlink_to(outside / "precious")
    runas.give(work, user, recursive=True)
    assert {p.name: p.lstat().st_uid for p in work.rglob("*")} == {"sub": 54321, "train.py": 54321, "leak": 54321}
    assert (outside / "precious").stat().st_uid == 0
    # and never walked again once it is the run's: only its own mode is set
    os.chown(work / "sub" / "train.py", 0, 0)
    runas.give(work, user, recursive=True)
    assert (work / "sub" / "train.py").stat().st_uid == 0


def test_the_evidence_keeps_a_runs_own_outputs_never_a_file_its_links_point_to(tmp_path: Path) -> None:
    """The evidence service (root) hashes a run's outputs and keeps small ones where `tau outputs --copy` fetches
    them: a link the run left to a key, or a folder swapped for a link after the listing, must not be read."""
    key = tmp_path / "creds" / "bootstrap.nk"
    key.parent.mkdir()
    key.write_text("SUAKEYNOTYOURS\n")
    run = tmp_path / "outputs" / "ws" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"loss": 1}\n')
    (run / "leak.jsonl").symlink_to(key)
    (run / "metrics-leak.jsonl").symlink_to(key)
    (run / "keys").symlink_to(key.parent)
    keeper = bundle.Keeper("run", budget=1 << 20)
    found = bundle.scan_dir(str(run), metrics=True, keeper=keeper)
    digest = hashlib.sha256(b'{"loss": 1}\n').hexdigest()
    assert [f["path"] for f in found["files"]] == ["metrics.jsonl"]
    assert found["metrics"] == [{"path": "metrics.jsonl", "text": '{"loss": 1}\n', "truncated": False}]
    assert keeper.blobs == {f"runs/run/outputs/{digest}": b'{"loss": 1}\n'}
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:  # what a folder swapped for a link between the listing and the read meets
        with pytest.raises(NotADirectoryError, match="Not a directory: .keys."):
            bundle._hash_file(fd, "keys/bootstrap.nk", keep=1 << 20, head=0)
    finally:
        os.close(fd)
    assert bundle.scan_dir(str(run / "keys"), metrics=False)["present"] is False


def test_an_interpreter_the_workspaces_user_cannot_run_falls_back_or_fails_naming_the_directory() -> None:
    user = runas.RunUser("tau-ws-probe", 54321, 54321)  # no such OS user is needed: modes decide
    system = "/usr/bin/python3"
    if not os.path.exists(system) or runas.cannot_reach(system, user, execute=True):
        pytest.skip(f"{system} is not here for other users to run")
    closed = Path(tempfile.mkdtemp(prefix="tau-python-", dir="/tmp"))  # 0700: only its owner enters
    try:
        python = closed / "python"
        python.symlink_to(system)
        why = f"{closed} is 0700 (owner {pwd.getpwuid(os.getuid()).pw_name}): tau-ws-probe may not enter it"
        runtimes = PodRuntimes(closed / "data", machine_pin="", fallback=system)
        runtimes.begin("recorded", work=closed, user=user,
                       request=RuntimeRequest(python=str(python), python_source="VIRTUAL_ENV"))
        got = wait_for(runtimes, "recorded")
        warning = f"the submitting interpreter {python} cannot be run by tau-ws-probe ({why}); the run uses {system}"
        assert isinstance(got, Ready) and (got.python, got.warning, got.environment["source"]) == (
            system, warning, "local cluster")
        # a pin (the run's TAU_PYTHON, the machine's TAU_LOCAL_PYTHON) the user cannot run falls back the same way
        pinned = PodRuntimes(closed / "data", machine_pin=str(python), fallback=system)
        pinned.begin("pinned", work=closed, request=RuntimeRequest(), user=user)
        got = wait_for(pinned, "pinned")
        assert isinstance(got, Ready) and (got.python, got.warning) == (system, (
            f"the interpreter TAU_LOCAL_PYTHON pins {python} cannot be run by tau-ws-probe ({why}); the run uses "
            f"{system}"))
        # taugrid's own base under root's 0700 home: the user's runs fall back to the system's python3, quietly
        # (`tau up` said so once); with no interpreter the user may run, the pod fails naming each one tried
        spare = PodRuntimes(closed / "data", machine_pin="", fallback=str(python), spares=(system,))
        spare.begin("spare", work=closed, request=RuntimeRequest(), user=user)
        got = wait_for(spare, "spare")
        assert isinstance(got, Ready) and (got.python, got.warning) == (system, "")
        none = PodRuntimes(closed / "data", machine_pin="", fallback=str(python), spares=())
        none.begin("none", work=closed, user=user,
                   request=RuntimeRequest(python=str(closed / "other"), python_source="TAU_PYTHON"))
        assert wait_for(none, "none") == Failed("EnvironmentFailed", (
            f"no interpreter can be run by tau-ws-probe, the OS user of this workspace's runs: {closed / 'other'}: "
            f"{why}; {python}: {why}\nhint: set TAU_PYTHON (before `tau run`) or TAU_LOCAL_PYTHON (before `tau up`) "
            "to an interpreter every user may run, e.g. /usr/bin/python3"))
    finally:
        shutil.rmtree(closed)


@ROOT_ONLY
def test_a_uv_the_workspaces_user_cannot_run_is_copied_where_it_can(data_dir: Path) -> None:
    user = runas.RunUser("tau-ws-probe", 54321, 54321)
    closed = Path(tempfile.mkdtemp(prefix="tau-uv-", dir="/tmp"))  # as uv under root's home (uv tool install)
    try:
        uv = closed / "uv"
        uv.write_text("#!/bin/sh\necho uv 0.0\n")
        uv.chmod(0o755)
        builder = EnvironmentBuilder(data_dir / "envs" / user.name, uv=str(uv), user=user)
        copy = data_dir / "envs" / user.name / ".bin" / "uv"
        assert builder.uv == str(copy) and copy.read_bytes() == uv.read_bytes()
        st = copy.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_IMODE(copy.parent.stat().st_mode)) == (0, 0o755, 0o755)
        assert runas.cannot_reach(copy, user, execute=True) == ""
        assert EnvironmentBuilder(copy.parent.parent, uv=str(uv), user=user).uv == str(copy)
        assert copy.stat().st_ino == st.st_ino  # the same uv: not copied again
        uv.write_text("#!/bin/sh\necho uv 0.1\n")  # an upgraded uv is copied again
        EnvironmentBuilder(copy.parent.parent, uv=str(uv), user=user)
        assert copy.read_bytes() == uv.read_bytes()
        assert EnvironmentBuilder(data_dir / "envs" / "shared", uv="/bin/sh").uv == "/bin/sh"  # no user: as is
    finally:
        shutil.rmtree(closed)


def wait_for(runtimes: PodRuntimes, pod: str) -> Ready | Failed:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = runtimes.poll(pod)
        if isinstance(got, Ready | Failed):
            return got
        time.sleep(0.05)
    raise AssertionError(f"{pod} still preparing")


def test_the_break_glass_key_is_written_outside_the_data_dir_and_only_its_public_key_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    d, mine = tmp_path / "data", tmp_path / "operator"
    monkeypatch.setenv(operator.OPERATOR_DIR_ENV, str(mine))
    _operator_keys(d, None)  # what `tau up` does before it starts the stack
    kept = operator.stack_dir(d) / "breakglass.nk"
    seed = creds.read_seed(kept)
    public = creds.public_key_of(seed)
    anchor_key = creds.load(d / "creds" / "anchor.nk").public_key
    assert capsys.readouterr().err.splitlines() == [
        f"break-glass key written to {kept}: the only identity that may change or delete streams; the stack keeps "
        "only its public key (keep the file offline)",
        f"audit anchors are signed by {anchor_key}, pinned in {operator.stack_dir(d) / 'anchor.pub'}: `tau verify "
        "--anchor` refuses any other signer"]
    assert [stat.S_IMODE(p.stat().st_mode) for p in (kept, kept.parent)] == [0o600, 0o700]
    assert [str(p) for p in d.rglob("*") if p.is_file() and seed.encode() in p.read_bytes()] == []
    assert not (d / "creds" / "breakglass.nk").exists()
    ids = auth.ensure_identities(d / "creds", SERVICES)  # what the supervisor admits: the key, never the seed
    assert ids.break_glass == creds.Identity(name="breakglass", public_key=public)
    assert f'"nkey": "{public}"' in auth.render(ids, None)

    _operator_keys(d, None)  # the next `tau up`: nothing new, nothing said
    assert capsys.readouterr().err == "" and creds.read_seed(kept) == seed

    # a seed an older `tau up` left in creds/ is moved out of the data dir, to a place the operator names
    old = creds.new_identity("breakglass")
    creds.write(d / "creds" / "breakglass.nk", old)
    chosen = tmp_path / "usb" / "glass.nk"
    _operator_keys(d, chosen)
    assert capsys.readouterr().err.splitlines() == [
        f"moved the break-glass key out of the data dir: {d / 'creds' / 'breakglass.nk'} -> {chosen} (keep it "
        "offline)"]
    assert not (d / "creds" / "breakglass.nk").exists() and creds.read_seed(chosen) == old.seed
    assert (d / "creds" / ".breakglass-issued").read_text() == old.public_key + "\n"


def test_an_anchor_file_re_signed_with_another_key_is_refused(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "data"
    monkeypatch.setenv("TAU_DATA_DIR", str(d))
    monkeypatch.setenv(operator.OPERATOR_DIR_ENV, str(tmp_path / "operator"))
    key = auth.ensure_key(d / "creds" / "anchor.nk", "anchor")
    operator.pin_anchor_key(d, key.public_key)
    doc = {"schema": anchor.SCHEMA, "time": "2026-12-01T00:00:00.000Z",
           "audit": {"first_seq": 1, "last_seq": 3, "last_digest": "ab", "drift": []},
           "runs": {"ws/r1": {"head": "h", "entries": 3, "digest": ""}}}
    genuine = anchor.sign(doc, bytearray(key.seed.encode()))
    assert anchor.signed_by([genuine], key.public_key) == []
    # the attacker rewrites the history and signs the whole file again with a key of their own: it verifies
    # against itself, as `tau verify --anchor` used to accept (it trusted whoever signed the first line)
    other = nkeys.from_seed(bytearray(creds.new_identity("eve").seed.encode()))
    forged_doc = {**doc, "runs": {"ws/r1": {"head": "h2", "entries": 3, "digest": ""}}}
    forged = anchor.sign(forged_doc, other.seed)
    assert anchor.signature_problems(forged) == []
    path = tmp_path / "ledger.jsonl"
    anchor.append(path, forged)
    eve = other.public_key.decode()
    refusal = (f"error: {path} is not signed by the pinned anchor key, so it proves nothing:\n"
               f"  - anchor of 2026-12-01T00:00:00.000Z is signed by {eve}, not the pinned anchor key "
               f"{key.public_key} (the file was re-signed or is another stack's)\n")
    got = CliRunner().invoke(verify, ["r1", "--anchor", str(path)])
    assert (got.exit_code, got.stderr) == (1, refusal)
    got = CliRunner().invoke(verify, ["r1", "--anchor", str(path), "--anchor-key", key.public_key])
    assert (got.exit_code, got.stderr) == (1, refusal)
    # passing the attacker's key is the operator's explicit choice; with no pin and no key nothing is trusted
    (operator.stack_dir(d) / operator.ANCHOR_KEY_FILE).unlink()
    got = CliRunner().invoke(verify, ["r1", "--anchor", str(path)])
    assert (got.exit_code, got.stderr) == (2, (
        f"error: no anchor key is pinned for the stack in {d} (`tau up` pins it in "
        f"{operator.stack_dir(d) / 'anchor.pub'}): pass --anchor-key KEY, the key the anchors must be signed by\n"))
    got = CliRunner().invoke(verify, ["r1", "--anchor", str(path), "--anchor-key", "Unot-a-key"])
    assert (got.exit_code, got.stderr) == (2, (
        "error: --anchor-key 'Unot-a-key' is not a public key (56 characters starting with U, as `tau up` or "
        "`tau admin chart-credentials` printed it)\n"))


def test_the_mode_says_why_runs_are_not_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert runas.decide(tmp_path, environ={runas.ENV: "stack"}) == runas.Decision("stack", why="TAU_RUN_AS=stack")
    assert runas.decide(tmp_path, environ={runas.ENV: "jail"}).refused == (
        "TAU_RUN_AS='jail' is not one of workspace, stack")
    if os.geteuid() != 0:
        got = runas.decide(tmp_path, environ={runas.ENV: "workspace"})
        assert got.mode == "stack" and got.refused.startswith("TAU_RUN_AS=workspace cannot be had: the stack runs as")
        return
    closed = Path(tempfile.mkdtemp(prefix="tau-mode-", dir="/tmp"))  # 0700, as pytest's own folders are
    try:
        (closed / "data").mkdir()
        got = runas.decide(closed / "data", environ={}, python="/bin/sh")
        assert got == runas.Decision("stack", why=(
            f"another OS user cannot reach the data dir {closed / 'data'} ({closed} is 0700 (owner root): other "
            "users may not enter it); use a data dir under a folder every user may enter, e.g. "
            "TAU_DATA_DIR=/var/lib/taugrid (root's default)"))
        # insisting on per-workspace users is honoured (their runs then fail, naming that directory)
        assert runas.decide(closed / "data", environ={runas.ENV: "workspace"}, python="/bin/sh").mode == "workspace"
        os.chmod(closed, 0o711)
        assert runas.decide(closed / "data", environ={}, python="/bin/sh") == runas.Decision("workspace")
        # a machine pin under a closed folder (as taugrid's own Python under root's 0700 home): runs fall back to
        # the first interpreter other users may run, and `tau up` notes which and why
        private = closed / "private"
        private.mkdir(mode=0o700)
        (private / "python").symlink_to("/bin/sh")
        spare, _ = runas.runnable(clean_pythons(), runas.OTHERS)
        got = runas.decide(closed / "data", environ={"TAU_LOCAL_PYTHON": str(private / "python")})
        if spare:
            assert got.mode == "workspace" and got.note.startswith(
                f"runs that bring no interpreter their workspace's OS user may run use {spare} ({private / 'python'}: "
                f"{private} is 0700 (owner root): other users may not enter it")
        got = runas.decide(closed / "data", environ={}, python=str(private / "python"))
        assert got == runas.Decision("stack", why=(
            f"another OS user cannot run any interpreter runs may fall back to ({private / 'python'}: {private} is "
            "0700 (owner root): other users may not enter it); set TAU_LOCAL_PYTHON to one every user may run, "
            "e.g. /usr/bin/python3"))
        os.chmod(closed / "data", 0o700)
        assert runas.decide(closed / "data", environ={}, python=str(closed / "data" / "python")).why.startswith(
            f"another OS user cannot reach the data dir {closed / 'data'} ({closed / 'data'} is 0700")
    finally:
        shutil.rmtree(closed)


def test_user_names_are_valid_for_useradd_and_never_shared() -> None:
    assert runas.user_name("ws-a") == "tau-ws-ws-a"
    long_name = "a-very-long-workspace-name-of-a-big-team"
    long = runas.user_name(long_name)
    assert long == "tau-ws-a-very-long-work-" + hashlib.sha256(long_name.encode()).hexdigest()[:8]
    assert len(long) == 32 and runas.user_name("___") == "tau-ws-" + hashlib.sha256(b"___").hexdigest()[:8]
    assert runas.user_name("Vision") != runas.user_name("vision") == "tau-ws-vision"
    digest = hashlib.sha256(b"Vision").hexdigest()[:8]
    assert runas.user_name("Vision") == f"tau-ws-vision-{digest}"
