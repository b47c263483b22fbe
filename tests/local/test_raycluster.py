"""The pods of an elastic RayJob's local Ray cluster (``local/raycluster.py`` through ``jobpods.pod_manifest``):
the head starts a Ray head on the workload's port and then runs the entrypoint (``RAY_ADDRESS`` set), a worker waits
for the head's port and joins it with ``--block``; each gets its own dashboard-agent port, Ray stays small, the
group's ``rayStartParams`` are kept where the local cluster does not decide, and ``python`` in the entrypoint (not in
``ray start``) is what the pod's interpreter replaces. A fixed-size RayJob's one pod is unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from taugrid.local import raycluster
from taugrid.local.jobpods import pod_manifest, replace_python
from tests.local.test_elastic_ray_pool import rayjob

POD = {"metadata": {"name": "r-a1-head", "uid": "u", "labels": {}}, "spec": {"nodeName": "g1"}}
START = ("ray start --head --port=41000 --temp-dir=/tmp/tau-ray-41000 --include-dashboard=false --disable-usage-stats "
         "--dashboard-agent-listen-port=41001 --num-cpus=0 --num-gpus=0 --object-store-memory=100000000 || exit $?")


def manifest(job: dict[str, Any], role: str, **kw: Any) -> dict[str, Any]:
    return pod_manifest(job, POD, index=0, pods=1, env={"TAU_LOCAL": "1"}, rdzv_port=41000, memory_limit=0,
                        hang_timeout_s=0, role=role, agent_port=41001, **kw)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_the_head_starts_ray_then_runs_the_entrypoint_against_it() -> None:
    job = rayjob("r-a1", workers=2, seconds=1)
    pod = manifest(job, raycluster.HEAD)
    [container] = pod["spec"]["containers"]
    assert container["name"] == "ray-head"
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    check, start, entrypoint = script.split("\n")
    assert check.startswith("command -v ray >/dev/null 2>&1 || {") and check.endswith("exit 127; }")
    assert start == START
    assert entrypoint == "python train.py"
    assert env_of(pod)["RAY_ADDRESS"] == "127.0.0.1:41000"
    assert env_of(pod)["RAY_USAGE_STATS_ENABLED"] == "0"
    # the pod's interpreter replaces the entrypoint's python, the only `python ` word of the script
    replaced = replace_python(pod, "/venv/bin/python")["spec"]["containers"][0]["command"][2]
    assert replaced.split("\n")[1:] == [START, "/venv/bin/python train.py"]


def test_a_worker_waits_for_the_head_and_joins_it_blocking() -> None:
    job = rayjob("r-a1", workers=2, seconds=1)
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParams"] = {
        "object-store-memory": "80000000", "port": "1", "block": "false", "resources": '{"tpu": 0}'}
    pod = manifest(job, raycluster.WORKERS, gpus=1)
    [container] = pod["spec"]["containers"]
    assert container["name"] == "ray-worker"
    _, _, script = container["command"]
    check, wait, join = script.split("\n")
    assert check.startswith("command -v ray")
    assert wait.startswith("n=0; until python -c 'import socket; socket.create_connection(('\"'\"'127.0.0.1'\"'\"', "
                           "41000), 1).close()' 2>/dev/null; do")
    assert "exit 1; fi; sleep 0.5; done" in wait
    # the group's own params where the local cluster does not decide (its port and block are ours)
    # its own temp dir (nodes sharing one race for socket names), tried three times
    assert join == ("n=0; until ray start --address=127.0.0.1:41000 --block --temp-dir=/tmp/tau-ray-41000-41001 "
                    "--disable-usage-stats --dashboard-agent-listen-port=41001 --num-cpus=1 --num-gpus=1 "
                    "--object-store-memory=80000000 '--resources={\"tpu\": 0}'; do n=$((n+1)); "
                    "if [ $n -ge 3 ]; then exit 1; fi; sleep 2; done")
    assert "RAY_ADDRESS" not in env_of(pod)


def test_a_workers_cpus_are_its_request_rounded_up() -> None:
    job = rayjob("r-a1", workers=2, seconds=1)
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1500m"}}
    _, _, script = manifest(job, raycluster.WORKERS)["spec"]["containers"][0]["command"]
    assert "--num-cpus=2 --num-gpus=0 " in script


def test_a_fixed_size_rayjob_runs_its_entrypoint_in_one_pod() -> None:
    job = rayjob("r-a1", workers=2, seconds=1)
    job["metadata"]["annotations"] = {}
    assert not raycluster.is_ray_cluster(job)
    pod = pod_manifest(job, POD, index=0, pods=1, env={}, rdzv_port=0, memory_limit=0, hang_timeout_s=0)
    assert pod["spec"]["containers"][0]["command"] == ["/bin/sh", "-c", "python train.py"]
    assert "RAY_ADDRESS" not in env_of(pod)


def test_temp_dirs_are_every_node_of_one_cluster() -> None:
    """What the controller removes once a Ray cluster's workload is done: its head's and each worker's temp dir,
    never another cluster's whose port starts with the same digits."""
    made = [Path(raycluster.temp_dir(65539)), Path(raycluster.temp_dir(65539, 40001)),
            Path(raycluster.temp_dir(655391)), Path(raycluster.temp_dir(655391, 40001))]
    try:
        for d in made:
            d.mkdir(exist_ok=True)
        assert raycluster.temp_dirs(65539) == [Path("/tmp/tau-ray-65539"), Path("/tmp/tau-ray-65539-40001")]
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
