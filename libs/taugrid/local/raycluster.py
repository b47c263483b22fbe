"""An elastic RayJob on the local pool: a Ray cluster of a head pod and worker pods, as KubeRay runs one. Pure
(``temp_dirs`` only lists /tmp).

A fixed-size RayJob runs locally as one pod (its entrypoint, no Ray cluster: ``jobpods``). An elastic one
(``policy.mode: elastic``; Kueue's ``kueue.x-k8s.io/elastic-job`` opt-in with taugrid's ``taugrid.io/elastic``
range) is admitted as Kueue admits a RayJob, two pod sets: ``head`` (one pod, the head group's requests) and
``workers`` (the worker group's replicas, the pod set that resizes). Its head pod starts a Ray head (``ray start
--head`` on the workload's own loopback port) and then runs the entrypoint there, which reaches the cluster through
``RAY_ADDRESS``; each worker pod waits for the head's port, as KubeRay's ``wait-gcs-ready`` init container does,
and joins it (``ray start --address=... --block``). A growth starts worker pods, a shrink stops the highest-index
ones (SIGTERM: ``ray start --block`` stops its raylet, and Ray sees the node leave).

Invariants: every Ray node on this machine gets a dashboard-agent port of its own (Ray's default, 52365, is one
per host: a second raylet on the same host fails to bind it); Ray stays small (no dashboard, no usage stats, an
object store of ``OBJECT_STORE_BYTES`` unless the group's ``rayStartParams`` say otherwise); ``ray stop`` is never
run (it stops every Ray process of the machine, other runs' too): the pod's process group is what ends.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from taugrid.core.quantity import parse_cpu

HEAD = "head"
WORKERS = "workers"
START_TRIES = 3  # a worker's ``ray start`` attempts
OBJECT_STORE_BYTES = 100_000_000  # Ray's minimum is 75 MiB; its default (30 % of memory) is far too much here
ELASTIC_OPT_IN = "kueue.x-k8s.io/elastic-job"
ELASTIC_RANGE = "taugrid.io/elastic"
_NO_RAY = ("command -v ray >/dev/null 2>&1 || { echo \"ray is not installed in the run's Python environment: add "
           "ray to runtime.pip or to the project's environment\" >&2; exit 127; }")
# rayStartParams the local cluster decides itself (the address and ports are the workload's; a block is a worker's)
_OURS = frozenset({"head", "address", "port", "block", "temp-dir", "dashboard-agent-listen-port", "include-dashboard",
                   "disable-usage-stats", "node-ip-address"})


def is_ray_cluster(job: Mapping[str, Any]) -> bool:
    """An elastic RayJob: run locally as a head pod and worker pods (else a RayJob is one pod)."""
    ann = (job.get("metadata") or {}).get("annotations") or {}
    return job.get("kind") == "RayJob" and ann.get(ELASTIC_OPT_IN) == "true" and bool(ann.get(ELASTIC_RANGE))


def head_group(job: Mapping[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["rayClusterSpec"]["headGroupSpec"])


def worker_group(job: Mapping[str, Any]) -> dict[str, Any]:
    groups = job["spec"]["rayClusterSpec"].get("workerGroupSpecs") or []
    return dict(groups[0]) if groups else {}


def requests_of(group: Mapping[str, Any]) -> dict[str, str]:
    """The group's pod's requests, as written (its first container's: the rendered Ray container)."""
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    return dict((containers[0].get("resources") or {}).get("requests") or {})


def address(port: int) -> str:
    return f"127.0.0.1:{port}"


def temp_dir(port: int, agent_port: int = 0) -> str:
    """Ray's session directory root of one node of the cluster whose head listens on ``port`` (the worker with its
    own ``agent_port``): short (Ray's socket paths live under it, and a Unix socket path has at most 107 bytes),
    under /tmp (every run user may create it), one per node: nodes starting together in one directory race for
    the same socket names (``raylet``, ``raylet.1``, ...; a raylet that loses fails to bind and the node never
    starts)."""
    return f"/tmp/tau-ray-{port}" + (f"-{agent_port}" if agent_port else "")


def temp_dirs(port: int) -> list[Path]:
    """Every node's temp dir of the cluster whose head listens on ``port`` (removed once the workload is done: Ray
    leaves its session's logs behind)."""
    return sorted(p for p in Path("/tmp").glob(f"tau-ray-{port}*")
                  if p.name == f"tau-ray-{port}" or p.name.startswith(f"tau-ray-{port}-"))


def _flags(params: Mapping[str, Any], defaults: Mapping[str, str]) -> list[str]:
    """KubeRay's ``rayStartParams`` as ``ray start`` flags (``--key=value``; ``"true"`` alone for a flag the CRD
    writes as a string), after ours; a key the local cluster decides is not taken from them."""
    merged = {**defaults, **{str(k): str(v) for k, v in params.items() if str(k) not in _OURS}}
    return [f"--{k}" if v == "" else f"--{k}={v}" for k, v in merged.items()]


def _cpus(requests: Mapping[str, str]) -> str:
    raw = requests.get("cpu")
    return str(max(1, math.ceil(parse_cpu(raw)))) if raw is not None else "1"


def head_command(job: Mapping[str, Any], *, port: int, agent_port: int) -> list[str]:
    """The head pod's command: start the Ray head, then the entrypoint (its exit code is the pod's; the shim ends
    what the head left running with the pod's process group)."""
    start = ["ray", "start", "--head", f"--port={port}", f"--temp-dir={temp_dir(port)}", "--include-dashboard=false",
             "--disable-usage-stats", f"--dashboard-agent-listen-port={agent_port}",
             *_flags(head_group(job).get("rayStartParams") or {},
                     {"num-cpus": "0", "num-gpus": "0", "object-store-memory": str(OBJECT_STORE_BYTES)})]
    entrypoint = str(job["spec"].get("entrypoint", ""))
    return ["/bin/sh", "-c", f"{_NO_RAY}\n{shlex.join(start)} || exit $?\n{entrypoint}"]


def worker_command(job: Mapping[str, Any], *, port: int, agent_port: int, gpus: int) -> list[str]:
    """A worker pod's command: wait for the head's port, then join it and block (SIGTERM stops the node and the
    shell); a start that fails (or a node that dies) is tried again, three times in all, as KubeRay restarts a
    worker's container."""
    group = worker_group(job)
    defaults = {"num-cpus": _cpus(requests_of(group)), "num-gpus": str(gpus),
                "object-store-memory": str(OBJECT_STORE_BYTES)}
    join = ["ray", "start", f"--address={address(port)}", "--block", f"--temp-dir={temp_dir(port, agent_port)}",
            "--disable-usage-stats", f"--dashboard-agent-listen-port={agent_port}",
            *_flags(group.get("rayStartParams") or {}, defaults)]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1).close()"
    wait = (f"n=0; until python -c {shlex.quote(probe)} 2>/dev/null; do n=$((n+1)); "
            f"if [ $n -ge 600 ]; then echo 'the Ray head at {address(port)} did not come up in 5 minutes' >&2; "
            "exit 1; fi; sleep 0.5; done")
    tries = (f"n=0; until {shlex.join(join)}; do n=$((n+1)); if [ $n -ge {START_TRIES} ]; then exit 1; fi; "
             "sleep 2; done")
    return ["/bin/sh", "-c", f"{_NO_RAY}\n{wait}\n{tries}"]


def head_env(port: int) -> dict[str, str]:
    """What the head pod's entrypoint needs to find its cluster (``ray.init()`` reads ``RAY_ADDRESS``)."""
    return {"RAY_ADDRESS": address(port), "RAY_USAGE_STATS_ENABLED": "0"}
