"""The repair ladder (pure): one step at a time, reset before reboot for severity 3, reboot first for severity 4,
replace-node once the node's budget is spent; a passed validation starts the budget over."""

from __future__ import annotations

from taugrid.health import repair
from taugrid.health.agent import REPAIRS, carry_out
from taugrid.health.probe import DeclaredProbe
from taugrid.health.wire import ConditionState, NodeRepair, NodeState


def drained(severity: int, *, gpu: int | None = 0, ctype: str = "GpuEccUncorrectable") -> NodeState:
    st = NodeState(node="n1", cordoned=True, drained=True)
    st.conditions["F"] = ConditionState(type=ctype, gpu=gpu, status="True", severity=severity)
    return st


def answer(st: NodeState, *, ok: bool, at: float) -> None:
    assert repair.fold(st, NodeRepair(node=st.node, step=st.repair_wanted, ok=ok, outcome="x", attempt=st.repairs,
                                      time=at))


def test_severity_3_resets_the_gpu_then_reboots_then_asks_for_replacement() -> None:
    st = drained(3)
    steps = []
    now = 0.0
    for _ in range(4):
        step, gpus = repair.next_step(st, now=now, budget=3, retry_s=60)
        steps.append((step, gpus))
        repair.ask(st, step, gpus, now)
        assert repair.next_step(st, now=now + 1000, budget=3, retry_s=60) == ("", [])  # one outstanding at a time
        answer(st, ok=False, at=now + 1)
        assert repair.next_step(st, now=now + 30, budget=3, retry_s=60) == ("", [])  # samples get time to show
        now += 100
    assert steps == [("gpu-reset", [0]), ("node-reboot", [0]), ("node-reboot", [0]), ("replace-node", [0])]
    assert repair.next_step(st, now=now + 1000, budget=3, retry_s=60) == ("", [])  # replace-node is the end


def test_severity_4_a_node_wide_fault_or_a_class_with_its_own_ladder_reboots_first() -> None:
    assert repair.next_step(drained(4, ctype="GpuXidError"), now=0, budget=3, retry_s=60)[0] == "node-reboot"
    assert repair.next_step(drained(3, gpu=None, ctype="GpuXidError"), now=0, budget=3, retry_s=60) == (
        "node-reboot", [])
    assert repair.next_step(drained(3, gpu=None, ctype="IbPortDown"), now=0, budget=3, retry_s=60)[0] == "node-reboot"
    assert repair.next_step(drained(3, ctype="GpuXidError"), now=0, budget=3, retry_s=60)[0] == "gpu-reset"


def test_a_deployment_plugs_its_own_ladder_and_the_agent_its_own_step() -> None:
    ladders = {**repair.LADDERS, "IbPortDown": ("ib-driver-reload", "node-reboot")}
    st = drained(3, gpu=None, ctype="IbPortDown")
    step, gpus = repair.next_step(st, now=0, budget=3, retry_s=60, ladders=ladders)
    assert (step, gpus) == ("ib-driver-reload", [])
    done: list[list[int]] = []

    def reload(probe: object, gpus: list[int]) -> tuple[bool, str]:
        done.append(gpus)
        return True, "mlx5 driver reloaded"

    assert carry_out(DeclaredProbe(1), step, gpus, {**REPAIRS, "ib-driver-reload": reload}) == (
        True, "mlx5 driver reloaded")
    assert done == [[]]
    assert carry_out(DeclaredProbe(1), step, gpus) == (False, "unknown repair step 'ib-driver-reload' on this node")

    def broken(probe: object, gpus: list[int]) -> tuple[bool, str]:
        raise OSError("no such device")

    ok, outcome = carry_out(DeclaredProbe(1), "gpu-reset", [0], {"gpu-reset": broken})
    assert not ok and outcome == "gpu-reset raised OSError('no such device')"


def test_nothing_is_asked_for_a_node_not_drained_or_no_longer_faulty_and_validation_resets_the_budget() -> None:
    st = drained(3)
    st.drained = False
    assert repair.next_step(st, now=0, budget=3, retry_s=60) == ("", [])
    st = drained(3)
    repair.ask(st, "gpu-reset", [0], 0)
    repair.released(st)
    assert (st.repairs, st.repair_wanted) == (0, "")


def test_the_agent_resets_only_gpus_no_process_holds_and_reboots_only_what_can_reboot() -> None:
    probe = DeclaredProbe(2)
    probe.inject_ecc(1, volatile=1)
    probe.busy.add(0)
    ok, outcome = carry_out(probe, "gpu-reset", [0, 1])
    assert not ok and outcome == "GPU 0 is in use by a process: not reset; declared GPU 1 reset"
    assert probe.resets == [1] and probe.gpus[1].ecc_volatile_uncorrected == 0
    assert carry_out(probe, "node-reboot", [0]) == (True, "declared node rebooted (2 GPU(s) reset)")

    class NoReboot:
        pass

    ok, outcome = carry_out(NoReboot(), "node-reboot", [])  # type: ignore[arg-type]
    assert not ok and outcome.startswith("reboot requested")
