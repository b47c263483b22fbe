"""tau.yaml ``policy.topology`` / ``topology_policy`` / ``topology_slice`` as Kueue TAS allows them: refused naming
the key and the fix, checked against the platform's topologies when it declares some, carried onto the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import load_tau_config
from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import ConfigError

SAMPLE_TEXT = (Path(__file__).resolve().parents[2] / "deploy" / "platform.yaml").read_text()
TOPOLOGY = """\
topologies:
  - name: default
    levels: [example.com/block, example.com/rack, kubernetes.io/hostname]
"""
TAS = load_platform(TOPOLOGY + SAMPLE_TEXT.replace("  - name: a100-80gb\n",
                                                   "  - name: a100-80gb\n    topology_name: default\n", 1))
PLAIN = load_platform(SAMPLE_TEXT)
RUN = """\
name: train
engine: job
entrypoint: train.py
image: nvcr.io/nvidia/pytorch:24.01-py3
execution: {launcher: torchrun, nodes: 4}
policy:
  workspace: vision
"""


def resolve(policy: str, platform=TAS) -> ResolvedRun:  # type: ignore[no-untyped-def]
    cfg = load_tau_config(RUN + policy)
    return resolve_run(cfg, platform, run_id="train-1", submission_id="s-1", workspace=None, platform_revision=1,
                       config_hash="h")


def refused(policy: str, platform=TAS) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        resolve(policy, platform)
    return {str(i["field"]): (str(i["message"]), str(i["fix"])) for i in err.value.issues}


def test_a_rack_with_slices_of_hosts_is_carried_onto_the_run() -> None:
    run = resolve("  topology: example.com/rack\n  topology_slice: {level: hostname, size: 2}\n")
    assert (run.topology_level, run.topology_required, run.topology_unconstrained) == ("example.com/rack", True,
                                                                                       False)
    assert (run.topology_slice_level, run.topology_slice_size) == ("kubernetes.io/hostname", 2)


def test_unconstrained_takes_no_level() -> None:
    run = resolve("  topology_policy: unconstrained\n")
    assert (run.topology_level, run.topology_unconstrained) == ("", True)
    assert refused("  topology: example.com/rack\n  topology_policy: unconstrained\n") == {
        "policy.topology": ("topology_policy: unconstrained places pods by free capacity at no level (Kueue's "
                            "podset-unconstrained-topology takes none)",
                            "remove policy.topology, or use topology_policy: required or preferred")}


def test_an_unknown_policy_and_a_level_without_a_topology() -> None:
    assert refused("  topology: example.com/rack\n  topology_policy: strict\n") == {
        "policy.topology_policy": ("unknown topology policy 'strict'", "use required, preferred or unconstrained")}
    assert refused("  topology_policy: preferred\n") == {
        "policy.topology_policy": ("needs policy.topology (the level to keep the pods within)",
                                   "set policy.topology, e.g. kubernetes.io/hostname")}


def test_a_slice_level_must_name_a_level_and_its_size_fit_the_pods() -> None:
    assert refused("  topology_slice: {level: rack, size: 2}\n") == {
        "policy.topology_slice.level": ("'rack' names no topology level",
                                        "write a node label key (e.g. cloud.provider.com/topology-rack) or hostname")}
    assert refused("  topology_slice: {level: example.com/rack, size: 8}\n") == {
        "policy.topology_slice.size": ("a slice of 8 pods is more than the run's 4 (Kueue's rule: the slice size is "
                                       "at most the pod set's count)", "use a size of at most 4")}
    assert refused("  topology_slice: {level: example.com/rack, size: 3}\n") == {
        "policy.topology_slice.size": ("the run's 4 pods do not divide into slices of 3 (each slice is placed whole)",
                                       "use a size that divides the pod count")}
    assert "policy.topology_slice.size" in refused("  topology_slice: {level: example.com/rack, size: 0}\n")


def test_levels_are_checked_against_the_platforms_topologies() -> None:
    assert refused("  topology: example.com/zone\n") == {
        "policy.topology": ("'example.com/zone' is a level of no topology that cluster queue 'vision' places by",
                            "use one of: example.com/block, example.com/rack, kubernetes.io/hostname")}
    assert refused("  topology: example.com/rack\n  topology_slice: {level: example.com/block, size: 2}\n") == {
        "policy.topology_slice.level": ("slice level 'example.com/block' is not at or below 'example.com/rack' in "
                                        "any topology (Kueue refuses a slice above the pod set's level)",
                                        "name a lower level for the slices, or a higher policy.topology")}


def test_a_platform_without_topologies_leaves_levels_to_the_cluster() -> None:
    run = resolve("  topology: example.com/zone\n", PLAIN)
    assert run.topology_level == "example.com/zone"


def test_a_request_on_a_queue_without_a_topology_flavor_is_refused() -> None:
    """No flavor of the vision queue names a topology here: Kueue would never admit a TAS request there."""
    platform = load_platform(TOPOLOGY + SAMPLE_TEXT)
    assert refused("  topology: example.com/rack\n", platform) == {
        "policy.topology": ("cluster queue 'vision' has no flavor that names a topology (Kueue admits a topology "
                            "request only on such a flavor, so the run would never start)",
                            "set topology_name on one of its resource_flavors, or remove the topology request")}
    assert list(refused("  topology_policy: unconstrained\n", platform)) == ["policy.topology_policy"]
    assert resolve("", platform).topology_level == ""  # no request: nothing to refuse
