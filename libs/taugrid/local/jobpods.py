"""The local Job controller's part: the Pod manifest a Job or RayJob makes, ready for the local kubelet. Pure.

A Job's pod is its template with what Kubernetes' Job controller and device plugins add (the completion-index
annotation and ``JOB_COMPLETION_INDEX``, the GPUs this machine granted), less the source-fetch init container
(the controller places the snapshot in the source volume itself); a fixed-size RayJob runs locally as one
process, its ``entrypoint`` through ``/bin/sh -c`` in the head group's pod; an elastic one is a Ray cluster of a
head pod and worker pods (``raycluster``: the pod's ``role``). The image is ignored, so ``python``/``python3``
at the head of a command become the host interpreter the controller chose.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from taugrid.core.manifestkeys import FETCH_CONTAINER
from taugrid.local import raycluster
from taugrid.local.rendezvous import local_command

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
HANG_ANNOTATION = "taugrid.io/hang-timeout"
PYTHONS = ("python", "python3")
_SHELL_PYTHON = re.compile(r"(?<![\w/.-])python3?(?= )")  # the first `python ` word of a shell line


def template(main: dict[str, Any], role: str = "") -> dict[str, Any]:
    """The pod template that runs: a Job's, or a RayJob's head group's (its worker group's for a Ray cluster's
    ``role`` ``workers``)."""
    if main["kind"] == "RayJob":
        if role == raycluster.WORKERS:
            return raycluster.worker_group(main)["template"]
        return main["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    return main["spec"]["template"]


def main_container(spec: dict[str, Any]) -> dict[str, Any]:
    containers = spec["containers"]
    return next((c for c in containers if c.get("name") == "main"), containers[0])


def replace_python(pod: dict[str, Any], python: str) -> dict[str, Any]:
    """``python``/``python3`` as a container's program become ``python`` (a host interpreter), in every init
    container and container; the input is not changed."""
    out = copy.deepcopy(pod)
    for c in [*(out["spec"].get("initContainers") or []), *(out["spec"].get("containers") or [])]:
        cmd = c.get("command") or []
        if cmd and cmd[0] in PYTHONS:
            c["command"] = [python, *cmd[1:]]
        elif not cmd and (c.get("args") or [None])[0] in PYTHONS:
            c["args"] = [python, *c["args"][1:]]
        elif cmd[:2] == ["/bin/sh", "-c"] and len(cmd) > 2:
            c["command"] = [*cmd[:2], _SHELL_PYTHON.sub(python, cmd[2], count=1), *cmd[3:]]
    return out


def pod_manifest(job: dict[str, Any], pod_obj: dict[str, Any], *, index: int, pods: int, env: dict[str, str],
                 rdzv_port: int, memory_limit: int, hang_timeout_s: float, role: str = "", agent_port: int = 0,
                 gpus: int = 0) -> dict[str, Any]:
    """The Pod to run for ``pod_obj`` (the published Pod: name, uid, labels) of ``job``. ``env`` comes first in
    the main container and wins over the template's entries of the same name (the machine's GPUs, retries).
    ``role``: a Ray cluster's ``head`` or ``workers`` pod (``raycluster``), whose Ray head listens on
    ``rdzv_port``, with ``agent_port`` its Ray node's own dashboard-agent port and ``gpus`` its GPU count."""
    tmpl = template(job, role)
    spec = copy.deepcopy(tmpl.get("spec") or {})
    meta = copy.deepcopy(pod_obj["metadata"])
    meta["annotations"] = {**(tmpl.get("metadata") or {}).get("annotations", {}), **meta.get("annotations", {}),
                           COMPLETION_INDEX: str(index)}
    if hang_timeout_s:
        meta["annotations"][HANG_ANNOTATION] = f"{hang_timeout_s:g}"
    spec["nodeName"] = pod_obj["spec"].get("nodeName", "")
    # Locally the controller is the source fetcher: it unpacks the snapshot into the source volume itself.
    inits = [c for c in spec.get("initContainers") or [] if c.get("name") != FETCH_CONTAINER]
    if inits:
        spec["initContainers"] = inits
    else:
        spec.pop("initContainers", None)
    spec.setdefault("restartPolicy", "Never")
    deadline = job["spec"].get("activeDeadlineSeconds")
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    main = main_container(spec)
    if role == raycluster.HEAD:
        main["command"] = raycluster.head_command(job, port=rdzv_port, agent_port=agent_port)
        env = {**env, **raycluster.head_env(rdzv_port)}
        main.pop("args", None)
    elif role == raycluster.WORKERS:
        main["command"] = raycluster.worker_command(job, port=rdzv_port, agent_port=agent_port, gpus=gpus)
        main.pop("args", None)
    elif job["kind"] == "RayJob":
        main["command"] = ["/bin/sh", "-c", str(job["spec"].get("entrypoint", ""))]
        main.pop("args", None)
    own = {e["name"] for e in main.get("env") or []}
    if "JOB_COMPLETION_INDEX" not in own:  # the Job controller's env; rendered Indexed Jobs define it already
        env = {"JOB_COMPLETION_INDEX": str(index), **env}
    main["env"] = [{"name": k, "value": v} for k, v in env.items()] + [
        e for e in main.get("env") or [] if e["name"] not in env]
    if memory_limit:
        main.setdefault("resources", {}).setdefault("limits", {})["memory"] = str(memory_limit)
    # an Indexed Job (multi-node or elastic torchrun): rendezvous on loopback, on a port of its own
    if job["kind"] == "Job" and (pods > 1 or rdzv_port):
        subdomain = str(spec.get("subdomain", ""))
        main["command"] = local_command(list(main.get("command") or []), job=job["metadata"]["name"],
                                        subdomain=subdomain, port=rdzv_port, index=index)
        main["args"] = local_command(list(main.get("args") or []), job=job["metadata"]["name"],
                                     subdomain=subdomain, port=rdzv_port, index=index)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
