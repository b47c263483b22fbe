"""The local kubelet on its own: a Pod manifest in, host processes, a Kubernetes PodStatus and logs out."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import pytest

from taugrid.local.kubelet import Kubelet

PY = sys.executable


def pod(name: str, containers: list[dict[str, Any]], *, init: list[dict[str, Any]] | None = None,
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"restartPolicy": "Never", "containers": containers, **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                         "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
            "spec": body}


def sh(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "ignored:latest", "command": ["/bin/sh", "-c", script], **extra}


async def run(
    kubelet: Kubelet, manifest: dict[str, Any], timeout: float = 30
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    handle = await kubelet.start(manifest, seen.append)
    final = await asyncio.wait_for(handle.wait(), timeout)
    return final, seen


def terminated(status: dict[str, Any], container: str) -> dict[str, Any]:
    for cs in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
        if cs["name"] == container:
            return cs["state"]["terminated"]  # type: ignore[no-any-return]
    raise AssertionError(f"no status for {container}")


def log_text(kubelet: Kubelet, name: str, container: str) -> list[str]:
    return [ln.text for ln in kubelet.read_log(name, container, final=True)[0]]


@pytest.fixture
def kubelet(tmp_path: Path) -> Kubelet:
    secrets = {("team-a", "hf"): {"token": "s3cret"}}
    maps = {("team-a", "settings"): {"mode": "fast", "level": "3"}}
    return Kubelet(tmp_path / "pods", resolve_secret=lambda ns, n: secrets.get((ns, n)),
                   resolve_config_map=lambda ns, n: maps.get((ns, n)), claims_dir=tmp_path / "claims", poll_s=0.05)


async def test_init_containers_run_in_order_then_the_containers_sharing_an_empty_dir(kubelet: Kubelet) -> None:
    mount = [{"name": "shared", "mountPath": "/workspace"}]
    manifest = pod("order", [sh("main", "cat /workspace/trail; echo main >> /workspace/trail", volumeMounts=mount)],
                   init=[sh("first", "echo first > /workspace/trail", volumeMounts=mount),
                         sh("second", "echo second >> /workspace/trail", volumeMounts=mount)],
                   volumes=[{"name": "shared", "emptyDir": {}}])
    final, seen = await run(kubelet, manifest)
    assert final["phase"] == "Succeeded"
    assert log_text(kubelet, "order", "main") == ["first", "second"]
    assert (kubelet.pods.dir("order") / "volumes" / "shared" / "trail").read_text() == "first\nsecond\nmain\n"
    assert [terminated(final, c)["reason"] for c in ("first", "second", "main")] == ["Completed"] * 3
    phases = [s["phase"] for s in seen]
    assert phases[0] == "Pending" and phases[-1] == "Succeeded" and "Running" in phases
    conds = {c["type"]: c["status"] for c in final["conditions"]}
    assert conds == {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "False", "Ready": "False"}


async def test_a_failing_init_container_fails_the_pod_and_nothing_after_it_runs(kubelet: Kubelet) -> None:
    manifest = pod("badinit", [sh("main", "echo never")],
                   init=[sh("fetch", "echo digest mismatch >&2; exit 3"), sh("after", "echo never")])
    final, _ = await run(kubelet, manifest)
    assert final["phase"] == "Failed"
    assert final["reason"] == "Init:Error"
    assert "init container fetch failed: Error (exit code 3)" in final["message"]
    assert terminated(final, "fetch")["exitCode"] == 3
    assert final["initContainerStatuses"][1]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert final["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert {c["type"]: c["status"] for c in final["conditions"]}["Initialized"] == "False"
    assert log_text(kubelet, "badinit", "fetch") == ["digest mismatch"]
    assert not kubelet.log_path("badinit", "main").exists()


async def test_env_from_secrets_config_maps_and_the_downward_api(kubelet: Kubelet) -> None:
    env = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
    ]
    main = sh("main", 'echo "$TOKEN $MODE $POD $NS $INDEX ${GONE-unset} $CFG_level"; '
                      'test "${TOKEN#s3}" = cret && echo "token ${#TOKEN} chars, as stored"', env=env,
              envFrom=[{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}])
    final, _ = await run(kubelet, pod("env", [main]))
    assert final["phase"] == "Succeeded"
    # the process got the secret; its log shows it redacted, and the pod's files on disk never held it
    assert log_text(kubelet, "env", "main") == ["[REDACTED] fast env team-a 1 unset 3", "token 6 chars, as stored"]
    pod_dir = kubelet.pods.dir("env")
    assert [p.name for p in pod_dir.rglob("*") if p.is_file() and b"s3cret" in p.read_bytes()] == []
    assert oct(pod_dir.stat().st_mode & 0o777) == "0o700"


async def test_dollar_paren_references_expand_as_the_kubelet_expands_them(kubelet: Kubelet) -> None:
    env = [{"name": "RANK", "valueFrom": {"fieldRef": {
               "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
           {"name": "HOST", "value": "node-$(RANK)"},
           {"name": "LATER", "value": "$(AFTER)"},  # defined below: not yet known, left as written
           {"name": "AFTER", "value": "x"}]
    main = {"name": "main", "command": [PY, "-c", "import sys, os; print(sys.argv[1:], os.environ['HOST'], "
                                                  "os.environ['LATER'])"],
            "args": ["--node_rank=$(RANK)", "$$(RANK)", "$(UNKNOWN)", "$$", "a$b", "$(unclosed"], "env": env}
    final, _ = await run(kubelet, pod("expand", [main]))
    assert final["phase"] == "Succeeded"
    assert log_text(kubelet, "expand", "main") == [
        "['--node_rank=1', '$(RANK)', '$(UNKNOWN)', '$', 'a$b', '$(unclosed'] node-1 $(AFTER)"]


async def test_working_dir_relative_and_on_a_claim_with_the_mount_path_rewritten(kubelet: Kubelet,
                                                                                tmp_path: Path) -> None:
    (kubelet.workdir("wd") / "sub").mkdir()
    mounts = [{"name": "data", "mountPath": "/data"}]
    manifest = pod("wd", [sh("main", "pwd; echo hi > /data/out.txt; echo $OUT", workingDir="sub"),
                          sh("side", "pwd", workingDir="/data/x", volumeMounts=mounts,
                             env=[{"name": "OUT", "value": "--out=/data/y"}])],
                   volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}])
    manifest["spec"]["containers"][0]["volumeMounts"] = mounts
    manifest["spec"]["containers"][0]["env"] = [{"name": "OUT", "value": "--out=/data/y"}]
    final, _ = await run(kubelet, manifest)
    assert final["phase"] == "Succeeded"
    claim = tmp_path / "claims" / "team-a" / "datasets"
    assert log_text(kubelet, "wd", "main") == [str(kubelet.workdir("wd") / "sub"), f"--out={claim}/y"]
    assert log_text(kubelet, "wd", "side") == [str(claim / "x")]
    assert (claim / "out.txt").read_text() == "hi\n"


async def test_exit_code_and_reason_of_a_failing_container(kubelet: Kubelet) -> None:
    final, _ = await run(kubelet, pod("exit", [sh("main", "exit 7")]))
    assert final["phase"] == "Failed"
    term = terminated(final, "main")
    assert (term["exitCode"], term["reason"]) == (7, "Error")
    assert "reason" not in final


async def test_memory_limit_kills_the_container_as_oom(kubelet: Kubelet) -> None:
    hog = {"name": "main", "command": [PY, "-c", "import time; b = bytearray(300 << 20); time.sleep(30)"],
           "resources": {"limits": {"memory": "64Mi"}}}
    final, _ = await run(kubelet, pod("oom", [hog]))
    term = terminated(final, "main")
    assert (final["phase"], term["exitCode"], term["reason"]) == ("Failed", 137, "OOMKilled")
    assert "exceeded the limit 64 MiB" in term["message"]


async def test_active_deadline_fails_the_pod_with_deadline_exceeded(kubelet: Kubelet) -> None:
    final, _ = await run(kubelet, pod("late", [sh("main", "exec sleep 30")], activeDeadlineSeconds=1))
    assert (final["phase"], final["reason"]) == ("Failed", "DeadlineExceeded")
    term = terminated(final, "main")
    assert (term["exitCode"], term["reason"]) == (143, "DeadlineExceeded")


async def test_stop_sends_sigterm_then_sigkill_after_the_grace_period(kubelet: Kubelet) -> None:
    stubborn = sh("stubborn", "trap '' TERM; echo up; while true; do sleep 0.1; done")
    polite = sh("polite", "echo up; exec sleep 30")
    seen: list[dict[str, Any]] = []
    handle = await kubelet.start(pod("stop", [stubborn, polite], terminationGracePeriodSeconds=30), seen.append)
    for _ in range(200):
        if len(log_text(kubelet, "stop", "stubborn")) == 1 and len(log_text(kubelet, "stop", "polite")) == 1:
            break
        await asyncio.sleep(0.05)
    await kubelet.stop("stop", grace_s=1.0)
    final = await asyncio.wait_for(handle.wait(), 20)
    assert final["phase"] == "Failed"
    assert (terminated(final, "polite")["exitCode"], terminated(final, "polite")["reason"]) == (143, "Error")
    assert (terminated(final, "stubborn")["exitCode"], terminated(final, "stubborn")["reason"]) == (137, "Error")


async def test_logs_carry_rfc3339_timestamps_and_follow_until_the_container_ends(kubelet: Kubelet) -> None:
    main = {"name": "main", "command": [PY, "-u", "-c",
                                        "import time\nfor i in range(3):\n print('line', i)\n time.sleep(0.3)"]}
    handle = await kubelet.start(pod("logs", [main]), lambda _s: None)
    followed = [line async for line in kubelet.follow_log("logs", "main", timestamps=True)]
    await handle.wait()
    assert [f.split(" ", 1)[1] for f in followed] == ["line 0", "line 1", "line 2"]
    stamps = [dt.datetime.fromisoformat(f.split(" ", 1)[0][:26] + "+00:00") for f in followed]
    assert stamps == sorted(stamps) and (stamps[2] - stamps[0]).total_seconds() >= 0.5
    lines, _ = kubelet.read_log("logs", "main", final=True)
    since = kubelet.read_log("logs", "main", final=True, since_time=lines[1].time)[0]
    assert [ln.text for ln in since] == ["line 1", "line 2"]


async def test_a_missing_secret_waits_as_create_container_config_error_until_it_appears(tmp_path: Path) -> None:
    secrets: dict[tuple[str, str], dict[str, str]] = {}
    kubelet = Kubelet(tmp_path / "pods", resolve_secret=lambda ns, n: secrets.get((ns, n)), poll_s=0.05)
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "late", "key": "token"}}}]
    seen: list[dict[str, Any]] = []
    handle = await kubelet.start(pod("waits", [sh("main", "echo $TOKEN", env=env)]), seen.append)
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.05)
    waiting = seen[-1]["containerStatuses"][0]["state"]["waiting"]
    assert seen[-1]["phase"] == "Pending"
    assert waiting == {"reason": "CreateContainerConfigError",
                       "message": 'containers[main].env[TOKEN].valueFrom.secretKeyRef: secret "late" not found'}
    secrets[("team-a", "late")] = {"token": "now-here"}  # 4+ bytes: shorter values cannot be redacted
    final = await asyncio.wait_for(handle.wait(), 20)
    assert final["phase"] == "Succeeded"
    assert log_text(kubelet, "waits", "main") == ["[REDACTED]"]  # its own secret, blanked in its log


async def test_a_running_pod_is_readopted_by_a_new_kubelet_not_run_twice(tmp_path: Path) -> None:
    first = Kubelet(tmp_path / "pods", poll_s=0.05)
    manifest = pod("survivor", [sh("main", "echo started; sleep 1; echo done")])
    await first.start(manifest, lambda _s: None)
    for _ in range(200):
        if log_text(first, "survivor", "main"):
            break
        await asyncio.sleep(0.05)
    await first.close()  # the caller restarts; the shim keeps the pod running
    second = Kubelet(tmp_path / "pods", poll_s=0.05)
    final, _ = await run(second, manifest)
    assert final["phase"] == "Succeeded"
    assert log_text(second, "survivor", "main") == ["started", "done"]


async def test_a_restart_policy_other_than_never_is_refused_with_the_field_named(kubelet: Kubelet) -> None:
    final, _ = await run(kubelet, pod("policy", [sh("main", "true")], restartPolicy="OnFailure"))
    assert final["phase"] == "Failed"
    assert final["reason"] == "CreateContainerError"
    assert final["message"].startswith("spec.restartPolicy=OnFailure: the local kubelet runs each container once")


async def test_termination_message_from_its_path_or_from_the_log_on_error(kubelet: Kubelet) -> None:
    said = sh("said", "echo starting; echo 'digest mismatch: want a, got b' > /dev/termination-log; exit 1")
    custom = sh("custom", 'echo done > "$MSG"', terminationMessagePath="/tmp/why",
                env=[{"name": "MSG", "value": "/tmp/why"}])
    tail = sh("tail", "echo one; echo two; exit 2", terminationMessagePolicy="FallbackToLogsOnError")
    final, _ = await run(kubelet, pod("why", [said, custom, tail]))
    assert terminated(final, "said")["message"] == "digest mismatch: want a, got b\n"
    assert terminated(final, "custom")["message"] == "done\n"
    assert terminated(final, "tail")["message"] == "one\ntwo"
    assert not Path("/dev/termination-log").exists()


async def test_the_hang_timeout_annotation_stops_a_silent_pod_as_hang(kubelet: Kubelet) -> None:
    manifest = pod("silent", [sh("main", "echo one; exec sleep 30")])
    manifest["metadata"]["annotations"]["taugrid.io/hang-timeout"] = "1"
    final, _ = await run(kubelet, manifest)
    term = terminated(final, "main")
    assert (final["phase"], term["exitCode"], term["reason"]) == ("Failed", 143, "Hang")
    assert term["message"] == "no output for 1s (resilience.hang_timeout)"
