"""Every leaf key of the tau.yaml JSON Schema is honoured or refused: written into a config that otherwise
resolves, it changes the resolved run or the rendered manifests (which still validate), or the config is refused
or warned about naming that key. ``SAMPLES`` must cover the schema exactly, so a new key fails here until it is
classified."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import load_tau_config, tau_json_schema
from taugrid.core.errors import ConfigError
from taugrid.render import render, validate
from taugrid.sources.archive import snapshot

PLATFORM = load_platform((Path(__file__).resolve().parent / "taugrid" / "platform.yaml").read_text())
DEL = object()  # a patch value that removes the key
DIGEST = "@sha256:" + "ab" * 32
JOB: dict[str, Any] = {"name": "walk", "engine": "job", "entrypoint": "train.py", "policy": {"workspace": "default"}}
RAY: dict[str, Any] = {**JOB, "engine": "ray"}
TORCHRUN = {**JOB, "compute": {"gpus": 2}, "execution": {"launcher": "torchrun"}}
TUNE = {**RAY, "execution": {"launcher": "ray-tune", "metric": "loss", "configs": {"lr": [0.1, 0.01]}}}
SOURCE = {**JOB, "run": {"source": {"image": "registry.example.com/p" + DIGEST}}}
MOUNT = {**JOB, "storage": {"mounts": [{"name": "a", "pvc": "p", "mount_path": "/a"}]}}
ASSET = {**JOB, "storage": {"image_assets": [
    {"name": "ref", "image": "registry.example.com/assets" + DIGEST, "source_path": "/opt/a", "mount_path": "/ref"}]}}
RAY_WS = {**JOB, "policy": {"workspace": "ray"}}
PROFILED = {**JOB, "policy": {"workspace": "default", "profile": "kind-cpu-job"}}
TOPOLOGY = {**JOB, "policy": {"workspace": "default", "topology": "kubernetes.io/hostname"}}
SLICED = {**JOB, "execution": {"launcher": "torchrun", "nodes": 4},
          "policy": {"workspace": "default", "topology_slice": {"level": "kubernetes.io/hostname", "size": 2}}}
OFFLOAD = {**JOB, "metrics": {"history": ["m.jsonl"]}, "experiment": {"project": "p", "name": "n"}}
NCCL = {**JOB, "runtime": {"env": {"NCCL_DEBUG": "INFO"}}}
PROFILER = {"profiler": {"mode": "nsys"}}


def _mount(**kw: Any) -> dict[str, Any]:
    return {"storage": {"mounts": [{"name": "a", "pvc": "p", "mount_path": "/a", **kw}]}}


def _asset(**kw: Any) -> dict[str, Any]:
    return {"storage": {"image_assets": [{**ASSET["storage"]["image_assets"][0], **kw}]}}


# leaf key -> (base config, patch merged into it)
SAMPLES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "name": (JOB, {"name": "other"}),
    "engine": (JOB, {"engine": "ray"}),
    "entrypoint": (JOB, {"entrypoint": "eval.py"}),
    "script": (JOB, {"entrypoint": DEL, "script": "eval.py"}),
    "image": (JOB, {"image": "python:3.12"}),
    "args": (JOB, {"args": ["--epochs", 3]}),
    "run.name": (JOB, {"name": DEL, "run": {"name": "other"}}),
    "run.engine": (JOB, {"engine": DEL, "run": {"engine": "ray"}}),
    "run.entrypoint": (JOB, {"entrypoint": DEL, "run": {"entrypoint": "eval.py"}}),
    "run.script": (JOB, {"entrypoint": DEL, "run": {"script": "eval.py"}}),
    "run.image": (JOB, {"run": {"image": "python:3.12"}}),
    "run.main_script": (JOB, {"entrypoint": DEL, "run": {"main_script": "eval.py"}}),
    "run.workload_kind": (JOB, {"engine": DEL, "run": {"workload_kind": "rayjob"}}),
    "run.source.image": (JOB, {"run": {"source": {"image": "registry.example.com/p" + DIGEST}}}),
    "run.source.path": (SOURCE, {"run": {"source": {"path": "/opt/project"}}}),
    "run.ttl_seconds_after_finished": (JOB, {"run": {"ttl_seconds_after_finished": 60}}),
    "run.working_dir": (RAY, {"run": {"working_dir": "src"}}),
    "run.working_dir_excludes": (JOB, {}),  # the snapshot's business: test_working_dir_excludes_shape_the_snapshot
    "run.active_deadline": (JOB, {"run": {"active_deadline": "1h"}}),
    "runtime.image": (JOB, {"runtime": {"image": "python:3.12"}}),
    "runtime.working_dir": (JOB, {"runtime": {"working_dir": "/workspace"}}),
    "runtime.pip": (RAY, {"runtime": {"pip": ["torch"]}}),
    "runtime.env": (JOB, {"runtime": {"env": {"LOG_LEVEL": "info"}}}),
    "runtime.env_secret": (JOB, {"runtime": {"env_secret": {"HF_TOKEN": "hf:token"}}}),
    "runtime.security.mode": (JOB, {"runtime": {"security": {"mode": "restricted"}}}),
    "runtime.security.run_as_user": (JOB, {"runtime": {"security": {"run_as_user": 1000}}}),
    "runtime.security.run_as_group": (JOB, {"runtime": {"security": {"run_as_group": 1000}}}),
    "runtime.devices": (JOB, {"runtime": {"devices": {"rdma/rdma_shared_device_a": 1}}}),
    "runtime.shm_size": (JOB, {"runtime": {"shm_size": "1Gi"}}),
    "compute.workers": (RAY, {"compute": {"workers": 2}}),
    "compute.gpus": (JOB, {"compute": {"gpus": 1}}),
    "compute.gpus_per_worker": (RAY, {"compute": {"gpus_per_worker": 1}}),
    "compute.cpu_request": (JOB, {"compute": {"cpu_request": "2"}}),
    "compute.memory_request": (JOB, {"compute": {"memory_request": "2Gi"}}),
    "compute.cpu_limit": (JOB, {"compute": {"cpu_limit": "4"}}),
    "compute.memory_limit": (JOB, {"compute": {"memory_limit": "4Gi"}}),
    "compute.head_cpu_request": (RAY, {"compute": {"head_cpu_request": "2"}}),
    "compute.head_cpu_limit": (RAY, {"compute": {"head_cpu_limit": "2"}}),
    "compute.head_memory_request": (RAY, {"compute": {"head_memory_request": "8Gi"}}),
    "compute.head_memory_limit": (RAY, {"compute": {"head_memory_limit": "8Gi"}}),
    "compute.worker_cpu_request": (RAY, {"compute": {"worker_cpu_request": "2"}}),
    "compute.worker_cpu_limit": (RAY, {"compute": {"worker_cpu_limit": "2"}}),
    "compute.worker_memory_request": (RAY, {"compute": {"worker_memory_request": "2Gi"}}),
    "compute.worker_memory_limit": (RAY, {"compute": {"worker_memory_limit": "2Gi"}}),
    "compute.gpu_resource_mode": (JOB, {"compute": {"gpus": 1, "gpu_resource_mode": "dra"}}),
    "compute.mig_profile": ({**JOB, "compute": {"gpus": 1}}, {"compute": {"mig_profile": "1g.18gb"}}),
    "compute.gpu_fraction": (JOB, {"compute": {"gpu_fraction": 0.5}}),
    "compute.gpu_vendor": ({**JOB, "compute": {"gpus": 1}}, {"compute": {"gpu_vendor": "amd"}}),
    "compute.gpu_memory": (JOB, {"compute": {"gpu_memory": "10Gi"}}),
    "compute.placement": (JOB, {"compute": {"placement": "spread"}}),
    "compute.gang": (JOB, {"compute": {"gang": False}}),
    "policy.workspace": (JOB, {"policy": {"workspace": "ray"}}),
    "policy.namespace": (JOB, {"policy": {"workspace": DEL, "namespace": "ray"}}),
    "policy.profile": (JOB, {"policy": {"profile": "kind-cpu"}}),
    "policy.queue": (RAY_WS, {"policy": {"queue": "dev"}}),
    "policy.team": (JOB, {"policy": {"team": "vision"}}),
    "policy.lane": (JOB, {"policy": {"lane": "training"}}),
    "policy.gpu_class": (JOB, {"policy": {"gpu_class": "h200-141gb"}}),
    "policy.mode": (JOB, {"policy": {"mode": "elastic"}}),
    "policy.elastic.min": (JOB, {"policy": {"elastic": {"min": 1}}}),
    "policy.elastic.max": (JOB, {"policy": {"elastic": {"min": 1, "max": 2}}}),
    "policy.elastic.step": (JOB, {"policy": {"elastic": {"min": 1, "step": 2}}}),
    "policy.elastic.cooldown": (JOB, {"policy": {"elastic": {"min": 1, "cooldown": "2m"}}}),
    "policy.topology": (JOB, {"policy": {"topology": "single-node-nvlink"}}),
    "policy.shape": (JOB, {"policy": {"shape": "2x8"}}),
    "policy.priority": (JOB, {"policy": {"priority": "high"}}),
    "policy.priority_tier": (JOB, {"policy": {"priority_tier": "high"}}),
    "policy.topology_policy": (TOPOLOGY, {"policy": {"topology_policy": "preferred"}}),
    "policy.topology_slice.level": (SLICED, {"policy": {"topology_slice": {"level": "example.com/rack"}}}),
    "policy.topology_slice.size": (SLICED, {"policy": {"topology_slice": {"size": 4}}}),
    "policy.workload_profile_snapshot": (JOB, {"policy": {"workload_profile_snapshot": "snap-1"}}),
    "policy.workload_priority_class": (JOB, {"policy": {"workload_priority_class": "high"}}),
    "policy.pod_priority_class": (JOB, {"policy": {"pod_priority_class": "research-high"}}),
    "policy.node_selector": (JOB, {"policy": {"node_selector": {"agentpool": "h200pool"}}}),
    "policy.clear_node_selector": (PROFILED, {"policy": {"clear_node_selector": True}}),
    "policy.disable_default_priorities": (JOB, {"policy": {"disable_default_priorities": True}}),
    "policy.preemptible": (JOB, {"policy": {"preemptible": False}}),
    "storage.data_pvc": (JOB, {"storage": {"data_pvc": "training-data"}}),
    "storage.result_pvc": (JOB, {"storage": {"result_pvc": "results"}}),
    "storage.output": (JOB, {"storage": {"output": "/data/tau-workspaces/default/exp-1"}}),
    "storage.checkpoint": (JOB, {"storage": {"checkpoint": "last.safetensors"}}),
    "storage.publish": (JOB, {"storage": {"publish": "staged"}}),
    "storage.volumes": (JOB, {"storage": {"volumes": ["model-cache"]}}),
    "storage.mounts.name": (MOUNT, _mount(name="b")),
    "storage.mounts.pvc": (MOUNT, _mount(pvc="q")),
    "storage.mounts.mount_path": (MOUNT, _mount(mount_path="/b")),
    "storage.mounts.read_only": (MOUNT, _mount(read_only=True)),
    "storage.mounts.sub_path": (MOUNT, _mount(sub_path="cache")),
    "storage.image_assets.name": (ASSET, _asset(name="other")),
    "storage.image_assets.image": (ASSET, _asset(image="registry.example.com/other" + DIGEST)),
    "storage.image_assets.source_path": (ASSET, _asset(source_path="/opt/b")),
    "storage.image_assets.mount_path": (ASSET, _asset(mount_path="/other")),
    "profiler.mode": (JOB, PROFILER),
    "profiler.rank": (JOB, {"profiler": {"mode": "nsys", "rank": "all"}}),
    "profiler.warmup": (JOB, {"profiler": {"mode": "nsys", "warmup": "30s"}}),
    "profiler.duration": (JOB, {"profiler": {"mode": "nsys", "duration": "60s"}}),
    "metrics.history": (JOB, {"metrics": {"history": ["metrics/*.jsonl"]}}),
    "metrics.offload.enabled": (OFFLOAD, {"metrics": {"offload": {"enabled": True}}}),
    "metrics.offload.image": (OFFLOAD, {"metrics": {"offload": {"image": "portal" + DIGEST}}}),
    "metrics.offload.out": (OFFLOAD, {"metrics": {"offload": {"out": "/data/out"}}}),
    "experiment.project": (JOB, {"experiment": {"project": "research"}}),
    "experiment.name": (JOB, {"experiment": {"name": "lr-sweep"}}),
    "experiment.group": (JOB, {"experiment": {"group": "baseline"}}),
    "experiment.title": (JOB, {"experiment": {"title": "LR sweep"}}),
    "execution.launcher": (JOB, {"execution": {"launcher": "torchrun"}}),
    "execution.processes_per_node": (TORCHRUN, {"execution": {"processes_per_node": 1}}),
    "execution.nodes": (TORCHRUN, {"execution": {"nodes": 2}}),
    "execution.metric": (TUNE, {"execution": {"metric": "accuracy"}}),
    "execution.mode": (TUNE, {"execution": {"mode": "max"}}),
    "execution.num_samples": (TUNE, {"execution": {"num_samples": 8}}),
    "execution.max_concurrent_trials": (TUNE, {"execution": {"max_concurrent_trials": 2}}),
    "execution.configs": (JOB, {"execution": {"configs": {"lr": 0.1}}}),
    "execution.allow_nccl_override": (NCCL, {"execution": {"allow_nccl_override": True}}),
    "resilience.max_retries": (JOB, {"resilience": {"max_retries": 2}}),
    "resilience.retry_on": (JOB, {"resilience": {"retry_on": ["Evicted"]}}),
    "resilience.checkpoint_path": (JOB, {"resilience": {"checkpoint_path": "/data/tau-workspaces/default/ck"}}),
    "resilience.backoff_initial": (JOB, {"resilience": {"backoff_initial": "10s"}}),
    "resilience.backoff_max": (JOB, {"resilience": {"backoff_max": "10m"}}),
    "resilience.hang_timeout": (JOB, {"resilience": {"hang_timeout": "5m"}}),
}


def _deref(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _object(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    node = _deref(node, defs)
    for option in [node, *node.get("anyOf", [])]:
        option = _deref(option, defs)
        if option.get("type") == "array":
            option = _deref(option.get("items", {}), defs)
        if "properties" in option:
            return option
    return None


def schema_leaves() -> list[str]:
    schema = tau_json_schema()
    defs = schema.get("$defs", {})

    def walk(node: dict[str, Any], prefix: str) -> list[str]:
        out: list[str] = []
        for key, child in (_object(node, defs) or {}).get("properties", {}).items():
            path = f"{prefix}{key}"
            out += walk(child, f"{path}.") if _object(child, defs) is not None else [path]
        return out

    return walk(schema, "")


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is DEL:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _plain(field: object) -> str:
    """``storage.mounts[0].name`` → ``storage.mounts.name`` (list items share their list's path)."""
    text = str(field)
    while "[" in text:
        head, _, rest = text.partition("[")
        text = head + rest.partition("]")[2]
    return text


def outcome(doc: dict[str, Any]) -> tuple[Any, ...]:
    """("refused", fields) | ("ok", warned fields, resolved run, manifests) — manifests validated."""
    try:
        cfg = load_tau_config(yaml.safe_dump(doc), path="tau.yaml")
        run = resolve_run(cfg, PLATFORM, run_id="walk-1", submission_id="s", workspace=None, platform_revision=1,
                          config_hash="fixed")
    except ConfigError as err:
        return ("refused", sorted(_plain(i["field"]) for i in err.issues))
    manifests = render(run, attempt=1)
    for manifest in manifests:
        validate(manifest)
    return ("ok", sorted(_plain(w["field"]) for w in cfg.warnings), msgspec.to_builtins(run), manifests)


def test_samples_cover_the_schema_exactly() -> None:
    assert sorted(SAMPLES) == sorted(schema_leaves())


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_key_is_honoured_or_refused(key: str) -> None:
    if key == "run.working_dir_excludes":
        return  # covered by test_working_dir_excludes_shape_the_snapshot
    base, patch = SAMPLES[key]
    before, after = outcome(base), outcome(_merge(base, patch))
    assert before != after, f"{key} changed nothing"
    named = after[1]
    if after[0] == "refused" or (named and named != before[1]):
        # a refusal or a new warning names the key or the block that holds it
        assert any(key == f or key.startswith(f + ".") for f in named), (key, named)
    if before[0] == "refused":  # allow_nccl_override: the key is what makes the config acceptable
        assert after[0] == "ok"


def test_working_dir_excludes_shape_the_snapshot(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('x')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 64)
    assert snapshot(tmp_path)[1] != snapshot(tmp_path, extra_excludes=["data/"])[1]


def test_mig_slices_and_devices_need_quota_of_their_own() -> None:
    """A queue with no quota for a MIG profile or a device can never admit the run: refused naming the key."""
    mig = outcome(_merge(JOB, {"compute": {"gpus": 1, "mig_profile": "3g.40gb"}}))
    rdma = outcome(_merge(JOB, {"runtime": {"devices": {"rdma/other": 1}}}))
    assert (mig[:2], rdma[:2]) == (("refused", ["compute.mig_profile"]), ("refused", ["runtime.devices.rdma/other"]))


def test_honoured_keys_reach_the_manifests_as_kubernetes_expects() -> None:
    """Spot checks of the new mechanisms: MIG resource, TAS annotation, priority class, run-as ids, mounts,
    asset init container, Tune env."""
    doc = _merge(ASSET, {"compute": {"gpus": 1, "gpu_resource_mode": "mig", "mig_profile": "1g.18gb"},
                         "policy": {"topology": "single-node", "pod_priority_class": "research-high"},
                         "runtime": {"security": {"run_as_user": 1000, "run_as_group": 2000}}})
    job = outcome(doc)[3][0]
    template = job["spec"]["template"]
    pod = template["spec"]
    main = pod["containers"][0]
    assert main["resources"]["limits"] == {"nvidia.com/mig-1g.18gb": "1"}
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == "kubernetes.io/hostname"
    assert (pod["priorityClassName"], pod["securityContext"]) == ("research-high",
                                                                 {"runAsUser": 1000, "runAsGroup": 2000})
    assert pod["initContainers"][-1]["image"] == "registry.example.com/assets" + DIGEST
    assert {"name": "asset-ref", "mountPath": "/ref", "readOnly": True} in main["volumeMounts"]
    tune = outcome(_merge(TUNE, {"execution": {"num_samples": 8, "mode": "max"}}))[3][0]
    env = yaml.safe_load(tune["spec"]["runtimeEnvYAML"])["env_vars"]
    assert {k: v for k, v in env.items() if k.startswith("TAU_TUNE_")} == {
        "TAU_TUNE_METRIC": "loss", "TAU_TUNE_MODE": "max", "TAU_TUNE_NUM_SAMPLES": "8",
        "TAU_TUNE_PARAM_SPACE": '{"lr": [0.1, 0.01]}'}
