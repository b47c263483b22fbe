"""flavor_fungibility and fair_sharing in platform.yaml: validated, rendered into the ClusterQueue, honoured locally."""

from __future__ import annotations

from typing import Any

import pytest

from taugrid.config.platform import Platform, load_platform
from taugrid.core.errors import PermanentError
from taugrid.local.admit import LocalAdmitter
from taugrid.render.kueue import render_platform
from taugrid.render.validate import validate

GPU = "nvidia.com/gpu"


def platform(**cq_extra: Any) -> dict[str, Any]:
    return {
        "resource_flavors": [{"name": "on-demand"}, {"name": "spot"}],
        "cohorts": [{"name": "lab"}],
        "cluster_queues": [{"name": "team", "cohort": "lab", "resource_groups": [
            {"covered_resources": [GPU], "flavors": [
                {"name": "on-demand", "resources": [{"name": GPU, "nominal_quota": 2}]},
                {"name": "spot", "resources": [{"name": GPU, "nominal_quota": 2}]}]}], **cq_extra}],
        "local_queues": [{"name": "q", "namespace": "ns", "cluster_queue": "team"}],
    }


def test_flavor_fungibility_renders_into_a_valid_cluster_queue() -> None:
    p = Platform.model_validate(platform(flavor_fungibility={
        "when_can_borrow": "TryNextFlavor", "when_can_preempt": "TryNextFlavor",
        "preference": "PreemptionOverBorrowing"}))
    cq = next(o for o in render_platform(p) if o["kind"] == "ClusterQueue")
    validate(cq)  # against deploy/crds/kueue.x-k8s.io_clusterqueues.yaml
    assert cq["spec"]["flavorFungibility"] == {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor",
                                               "preference": "PreemptionOverBorrowing"}


def test_unset_flavor_fungibility_renders_nothing_so_kueue_defaults_apply() -> None:
    cq = next(o for o in render_platform(Platform.model_validate(platform())) if o["kind"] == "ClusterQueue")
    assert "flavorFungibility" not in cq["spec"]


def test_preference_without_try_next_flavor_is_refused_naming_the_fix() -> None:
    import yaml
    text = yaml.safe_dump(platform(flavor_fungibility={"preference": "BorrowingOverPreemption"}))
    with pytest.raises(PermanentError, match="preference can only be set when when_can_borrow and "
                                             "when_can_preempt are both TryNextFlavor"):
        load_platform(text)


def test_unknown_fungibility_value_is_refused() -> None:
    import yaml
    with pytest.raises(PermanentError, match="when_can_borrow"):
        load_platform(yaml.safe_dump(platform(flavor_fungibility={"when_can_borrow": "Sometimes"})))


def test_local_admitter_honours_fungibility_and_fair_sharing_settings() -> None:
    doc = platform(flavor_fungibility={"when_can_borrow": "TryNextFlavor", "when_can_preempt": "Preempt"})
    doc["fair_sharing"] = {"enable": True, "preemption_strategies": ["LessThanInitialShare"]}
    la = LocalAdmitter(node="n0", capacity={"memory": 1e12}, gpu_count=4)
    la.configure(Platform.model_validate(doc))
    assert la.engine is not None
    ff = la.engine.queues["team"].spec.flavor_fungibility
    assert (ff.when_can_borrow, ff.when_can_preempt) == ("TryNextFlavor", "MayStopSearch")  # Preempt is the old name
    assert la.engine.fair_sharing and la.engine.fair_sharing_strategies == ("LessThanInitialShare",)


def test_fair_sharing_defaults_to_on_only_when_a_weight_differs() -> None:
    la = LocalAdmitter(node="n0", capacity={"memory": 1e12}, gpu_count=4)
    la.configure(Platform.model_validate(platform()))
    assert la.engine is not None and not la.engine.fair_sharing
    la.configure(Platform.model_validate(platform(fair_sharing={"weight": 2})))
    assert la.engine.fair_sharing
    assert la.engine.fair_sharing_strategies == ("LessThanOrEqualToFinalShare", "LessThanInitialShare")


def test_render_says_where_fair_sharing_goes_on_kubernetes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml
    from click.testing import CliRunner

    from taugrid.cli.main import cli
    doc = platform()
    doc["fair_sharing"] = {"enable": True, "preemption_strategies": ["LessThanInitialShare"]}
    path = tmp_path / "platform.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli, ["platform", "render", str(path)])
    assert result.exit_code == 0, result.output
    assert "fairSharing: {enable: true, preemptionStrategies: [LessThanInitialShare]}" in result.stderr
    assert all(o["kind"] != "Configuration" for o in yaml.safe_load_all(result.stdout))
