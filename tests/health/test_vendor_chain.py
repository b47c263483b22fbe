"""Issue 26's check on the local backend: a platform with NVIDIA, AMD and Gaudi flavors (one per model, selecting
its nodes by label), each node shown by `tau nodes` with its vendor and model. Runs asking for each vendor get its
resource, its visibility variables and one of its nodes; an AMD ECC fault and a Gaudi critical event each drive
the chain fault → condition → cordon + drain → retry on the vendor's healthy node → the vendor's own GPU reset →
re-validation → uncordon.

The faulted nodes' agents run the real AMD and Gaudi probes (``health.smi`` over the tools' output,
``health.vendorlib`` over the libraries) against stand-in machines: amd-smi's JSON and hl-smi's CSV from their
state, and ``amdsmi``/``pyhlml`` stand-ins with the real names (``tests/health/vendorfakes.py``). The services run
in-process on a private nats-server (``test_chain.running_chain``); the pods are real processes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus import kv
from taugrid.client.summaries import gpu_kind, node_rows
from taugrid.core.errors import NotFound
from taugrid.health import smi
from taugrid.health.probe import DeclaredProbe, HealthProbe
from taugrid.health.vendorlib import AmdLibEvents, GaudiLibEvents
from taugrid.health.wire import NodeCordon, NodeRepair, NodeState, NodeValidation
from tests.health.test_chain import history, recorded_node, running_chain, wait_for
from tests.health.vendorfakes import FakeAmdSmi, FakePyhlml
from tests.platforms import lab_platform, workspace

MODEL = "taugrid.io/gpu-model"  # the label the admin puts on each node, which each vendor's flavor selects
FLAVORS = {"h100": ("nvidia-h100", "nvidia.com/gpu", 1), "mi300x": ("amd-mi300x", "amd.com/gpu", 2),
           "gaudi3": ("gaudi3", "habana.ai/gaudi", 2)}
PLATFORM = lab_platform(
    workspaces=[workspace(output_root="/tmp")],
    resource_flavors=[{"name": f, "gpu_model": m, "node_labels": {MODEL: m}} for f, (m, _, _) in FLAVORS.items()],
    cluster_queues=[{"name": "lab", "resource_groups": [{
        "covered_resources": ["cpu", "memory", "nvidia.com/gpu", "amd.com/gpu", "habana.ai/gaudi"],
        "flavors": [{"name": f, "resources": [
            {"name": "cpu", "nominal_quota": "16"}, {"name": "memory", "nominal_quota": "32Gi"},
            *({"name": r, "nominal_quota": str(n if r == own else 0)}
              for r in ("nvidia.com/gpu", "amd.com/gpu", "habana.ai/gaudi"))]}
            for f, (_, own, n) in FLAVORS.items()]}]}],
    local={"nodes": [{"name": "nv-0", "gpus": 1, "gpu_model": "nvidia-h100", "gpu_memory": "16000Mi",
                      "labels": {MODEL: "nvidia-h100"}},
                     *({"name": name, "gpus": 1, "gpu_model": model, "labels": {MODEL: model}}
                       for name, model in (("mi-a", "amd-mi300x"), ("mi-b", "amd-mi300x"), ("hl-a", "gaudi3"),
                                           ("hl-b", "gaudi3")))]})
KEYS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "HABANA_VISIBLE_DEVICES")
SCRIPT = (
    "import json, os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM: stopping', flush=True), sys.exit(143)))\n"
    f"print(json.dumps({{k: os.environ.get(k) for k in {KEYS!r}}}), flush=True)\n"
    "print('attempt', os.environ['TAU_RETRY_ATTEMPT'], flush=True)\n"
    "time.sleep(120 if os.environ['TAU_RETRY_ATTEMPT'] == '1' and os.environ.get('HOLD') else 0.2)\n"
)


def tau_yaml(name: str, vendor: str, *, hold: bool) -> str:
    env = "runtime: {env: {HOLD: '1'}}\n" if hold else ""
    return (f"name: {name}\nentrypoint: python3\nargs: ['-c', {json.dumps(SCRIPT)}]\n"
            f"compute: {{gpus: 1, gpu_vendor: {vendor}}}\n{env}"
            "resilience: {max_retries: 2, backoff_initial: 100ms, backoff_max: 100ms}\n")


class AmdMachine:
    """One MI300X: ``amd-smi metric --json`` as its state says, ``amd-smi reset`` clearing the ECC count the
    driver keeps, and amdsmi's view (per-block ECC) through the stand-in library."""

    def __init__(self) -> None:
        self.lib = FakeAmdSmi(1, bdfs=["0000:0c:00.0"])
        self.uncorrectable = 0
        self.resets: list[list[str]] = []

    def run(self, argv: list[str]) -> str:
        if argv[:2] == ["amd-smi", "reset"]:
            self.resets.append(argv)
            self.uncorrectable = 0
            return ""
        return json.dumps({"gpu_data": [{
            "gpu": 0, "ecc": {"total_uncorrectable_count": self.uncorrectable, "total_deferred_count": 0},
            "temperature": {"hotspot": {"value": 52, "unit": "C"}, "edge": {"value": 45, "unit": "C"}},
            "mem_usage": {"total_vram": {"value": 196592, "unit": "MB"}, "used_vram": {"value": 0, "unit": "MB"}},
            "usage": {"gfx_activity": {"value": 0, "unit": "%"}},
            "power": {"socket_power": {"value": 180, "unit": "W"}}, "pcie": {"replay_count": 0}}]})

    def fault(self) -> None:
        """An uncorrectable HBM error: the driver's total and amdsmi's UMC block count both go up."""
        self.uncorrectable = 1
        self.lib.uncorrectable(0, "UMC")

    def probe(self) -> HealthProbe:
        return smi.amd_probe(self.run, events=AmdLibEvents(self.lib))


class GaudiMachine:
    """One Gaudi 3: ``hl-smi -Q … -f csv`` and ``hl-smi -i <bus> -r``, and pyhlml's events through the stand-in."""

    def __init__(self) -> None:
        self.lib = FakePyhlml(1, bus_ids=["0000:19:00.0"])
        self.resets: list[list[str]] = []

    def run(self, argv: list[str]) -> str:
        if "-r" in argv:
            self.resets.append(argv)
            return ""
        return "0, 01P4-HL3090A0-18-U4V193-22-04-00, HL-325L, 0000:19:00.0, 131072, 0, 0, 41, 226, 0, 0\n"

    def fault(self) -> None:
        self.lib.raise_event(0, "HLML_EVENT_CRITICAL_ERR")

    def probe(self) -> HealthProbe:
        return smi.gaudi_probe(self.run, events=GaudiLibEvents(self.lib))


def probes(machines: dict[str, Any]) -> dict[str, HealthProbe]:
    """Every node's agent: the NVIDIA node's declared GPU, the stand-in machines' real vendor probes."""
    return {"nv-0": DeclaredProbe(1, 16000), **{name: m.probe() for name, m in machines.items()}}


async def test_runs_asking_for_each_vendor_get_its_resource_variables_and_node(tmp_path: Path) -> None:
    machines = {"mi-a": AmdMachine(), "mi-b": AmdMachine(), "hl-a": GaudiMachine(), "hl-b": GaudiMachine()}
    async with running_chain(tmp_path, "local", platform=PLATFORM, probes=probes(machines)) as chain:
        client = chain["client"]
        for name in chain["agents"]:
            await chain["tick"](name)
        # what `tau nodes` shows (its rows from node_state): every node with its vendor and model
        rows = node_rows(await kv.values(chain["bus"], "node_state", NodeState, prefix="node."), [], time.time())
        assert [(r["node"], r["gpus"], gpu_kind(r)) for r in rows] == [
            ("hl-a", 1, "intel-gaudi/HL-325L"), ("hl-b", 1, "intel-gaudi/HL-325L"), ("mi-a", 1, "amd/AMD GPU"),
            ("mi-b", 1, "amd/AMD GPU"), ("nv-0", 1, "nvidia/Declared GPU")]
        runs = {vendor: await client.submit_text(tau_yaml(f"say-{vendor}", vendor, hold=False),
                                                 name=f"say-{vendor}")
                for vendor in ("nvidia", "amd", "intel-gaudi")}

        async def all_done() -> bool:
            try:
                states = [(await client.settled(r)).state for r in runs.values()]
            except NotFound:  # not recorded yet
                return False
            return states == ["succeeded"] * len(runs)

        await wait_for(all_done, "the three runs to succeed", timeout=60)
        got = {}
        for vendor, run_id in runs.items():
            rec = await client.settled(run_id)
            assert rec.resolved is not None
            said = json.loads((await chain["lines"](run_id, 1))[0])
            got[vendor] = (rec.resolved.gpu_resource, rec.node[:2], said)
    assert got == {
        # "" is nvidia.com/gpu (ResolvedRun.gpu_resource)
        "nvidia": ("", "nv", {"CUDA_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": None, "HIP_VISIBLE_DEVICES": None,
                              "HABANA_VISIBLE_DEVICES": None}),
        "amd": ("amd.com/gpu", "mi", {"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "0",
                                      "HIP_VISIBLE_DEVICES": "0", "HABANA_VISIBLE_DEVICES": None}),
        "intel-gaudi": ("habana.ai/gaudi", "hl", {"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": None,
                                                  "HIP_VISIBLE_DEVICES": None, "HABANA_VISIBLE_DEVICES": "0"}),
    }


CASES = {
    # vendor: (its nodes, the machine, the conditions the fault raises, the reset the repair runs)
    "amd": (("mi-a", "mi-b"), AmdMachine, ["GpuEccUncorrectable"], ["amd-smi", "reset", "--gpureset", "--gpu", "0"]),
    "intel-gaudi": (("hl-a", "hl-b"), GaudiMachine, ["GpuFatalError"], ["hl-smi", "-i", "0000:19:00.0", "-r"]),
}


@pytest.mark.parametrize("vendor", sorted(CASES))
async def test_a_vendor_fault_moves_the_run_to_a_healthy_node_and_the_vendors_reset_brings_the_node_back(
        tmp_path: Path, vendor: str) -> None:
    nodes, machine, conditions, reset = CASES[vendor]
    machines = {name: machine() for name in nodes}
    async with running_chain(tmp_path, "local", platform=PLATFORM, probes=probes(machines)) as chain:
        bus, client, tick = chain["bus"], chain["client"], chain["tick"]
        for name in nodes:
            await tick(name)
        run_id = await client.submit_text(tau_yaml("chain", vendor, hold=True), name="chain")

        faulty = await wait_for(lambda: recorded_node(client, run_id), "attempt 1 running")
        healthy = next(n for n in nodes if n != faulty)
        await wait_for(lambda: chain["printed"](run_id, 1, "attempt 1"), "attempt 1 printing")
        machines[faulty].fault()
        await tick(faulty)

        async def finished() -> str:
            rec = await client.settled(run_id)
            return rec.state if rec.state in ("succeeded", "failed") else ""

        assert await wait_for(finished, "the run to finish") == "succeeded"
        for _ in range(8):  # repair, clean samples, re-validation, uncordon
            await tick(faulty)
            if any(k == "node.uncordon" for _, k, _, _ in await history(bus, run_id, faulty)):
                break
        events = await history(bus, run_id, faulty)
        attempt2 = await chain["lines"](run_id, 2)
    kinds = [k for _, k, _, _ in events]

    def first(kind: str, pred: Any = lambda d, a: True) -> int:
        found = [i for i, (_, k, d, a) in enumerate(events) if k == kind and pred(d, a)]
        assert found, f"no {kind} in the history: {[(k, a) for _, k, _, a in events]}"
        return found[0]

    fault = first(f"node.condition.{conditions[0]}", lambda d, a: d["status"] == "True")
    cordon, drained = first("node.cordon"), first("health.degraded", lambda d, a: a == 1)
    retry, rerun = first("recovery.retrying"), first("exec.running", lambda d, a: a == 2)
    success, repaired = first("exec.succeeded"), first("node.repair")
    validated, uncordon = first("node.validation"), first("node.uncordon")
    assert first("exec.running", lambda d, a: a == 1) < fault < cordon < drained < retry < rerun < success, kinds
    assert success < repaired < validated < uncordon, kinds
    cordoned = msgspec.convert(events[cordon][2], NodeCordon)
    assert cordoned.drain and cordoned.conditions == conditions
    retrying = events[retry][2]
    assert (retrying["classification"], retrying["exclude_nodes"], retrying["attempt"]) == ("gpu_fault", [faulty], 2)
    assert events[rerun][2]["node"] == healthy
    repair = msgspec.convert(events[repaired][2], NodeRepair)
    assert (repair.step, repair.ok, repair.gpus, repair.outcome) == (
        "gpu-reset", True, [0], f"GPU 0 reset ({' '.join(reset)})")
    assert machines[faulty].resets == [reset] and machines[healthy].resets == []
    validation = msgspec.convert(events[validated][2], NodeValidation)
    assert (validation.ok, validation.detail) == (True, "1 GPU(s) answer; ECC and row remapping clean")
    said = json.loads(attempt2[0])
    assert attempt2[1:] == ["attempt 2"]
    assert said == ({"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0",
                     "HABANA_VISIBLE_DEVICES": None} if vendor == "amd" else
                    {"CUDA_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": None, "HIP_VISIBLE_DEVICES": None,
                     "HABANA_VISIBLE_DEVICES": "0"})
