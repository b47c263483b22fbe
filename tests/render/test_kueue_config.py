"""``platform.yaml`` ``wait_for_pods_ready`` rendered as Kueue's controller Configuration (``render.kueueconfig``):
the sample ``waitForPodsReady`` of Kueue v0.19.2's ``config/components/manager/controller_manager_config.yaml``
written in taugrid's names must come back as that very block."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from taugrid.cli.main import cli
from taugrid.config.platform import load_platform
from taugrid.render import kueueconfig

# Kueue v0.19.2's sample, uncommented.
KUEUE_SAMPLE = {"timeout": "5m", "recoveryTimeout": "3m", "blockAdmission": False,
                "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": None, "backoffBaseSeconds": 60,
                                      "backoffMaxSeconds": 3600}}
SAMPLE = """wait_for_pods_ready:
  timeout: 5m
  recovery_timeout: 3m
  block_admission: false
  requeuing_strategy: {timestamp: Eviction, backoff_limit_count: null, backoff_base_seconds: 60,
                       backoff_max_seconds: 3600}
"""


@pytest.mark.parametrize(("seconds", "text"), [(1800, "30m"), (90, "1m30s"), (3600, "1h"), (0.5, "500ms"),
                                               (0, "0s"), (5400.5, "1h30m0.5s")])
def test_durations_are_go_durations(seconds: float, text: str) -> None:
    assert kueueconfig.go_duration(seconds) == text


def test_kueues_sample_comes_back_as_kueue_writes_it() -> None:
    cfg = kueueconfig.configuration(load_platform(SAMPLE))
    assert cfg == {"apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
                   "waitForPodsReady": KUEUE_SAMPLE}


def test_kueues_defaults_need_nothing_set_and_disabling_is_kueues_feature_gate() -> None:
    assert kueueconfig.configuration(load_platform("cohorts: []\n")) is None
    assert kueueconfig.configuration(load_platform("wait_for_pods_ready: {timeout: 30m}\n")) is None
    assert kueueconfig.configuration(load_platform("wait_for_pods_ready: {enable: false}\n")) == {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "featureGates": {"DisableWaitForPodsReady": True}}


def test_render_says_what_to_put_in_kueues_configmap(tmp_path: Path) -> None:
    path = tmp_path / "platform.yaml"
    path.write_text("resource_flavors: [{name: default}]\n" + SAMPLE)
    result = CliRunner().invoke(cli, ["platform", "render", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith("# wait_for_pods_ready is Kueue's controller Configuration")
    block = yaml.safe_load("\n".join(line.removeprefix("#   ") for line in lines[1:]))
    assert block == {"waitForPodsReady": KUEUE_SAMPLE}
    assert all(o["kind"] != "Configuration" for o in yaml.safe_load_all(result.stdout))
