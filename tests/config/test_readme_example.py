"""The README's example tau.yaml, extracted from README.md (so a README edit breaks this test): it validates,
resolves on a CPU-only machine's default platform, and a GPU variant of it is refused there up front."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from taugrid.config.machine import default_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import config_hash, load_tau_config
from taugrid.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """The first ```yaml block of README.md that holds an `entrypoint:` (the minimal tau.yaml)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    return next(b for b in blocks if "entrypoint:" in b)


def _resolve(text: str) -> object:
    cfg = load_tau_config(text, path="tau.yaml")
    platform = default_platform(2, 8 << 30, [], output_root="/tmp/runs")  # what `tau up` derives on a CPU box
    return resolve_run(cfg, platform, run_id="train-1", submission_id="s", workspace=None, platform_revision=1,
                       config_hash=config_hash(cfg))


def test_readme_example_validates_and_resolves_on_a_machine_without_gpus() -> None:
    text = readme_example()
    cfg = load_tau_config(text, path="tau.yaml")
    assert (cfg.name, cfg.entrypoint, cfg.compute.gpus) == ("train", "train.py", None)
    run = _resolve(text)
    assert run.workspace == "default" and run.output_dir == "/tmp/runs/default/train-1"  # type: ignore[attr-defined]


def test_a_gpu_request_on_a_machine_without_gpus_is_refused_naming_the_field() -> None:
    text = re.sub(r"compute: \{[^}]*\}", "compute: {gpus: 1}", readme_example())
    with pytest.raises(ConfigError) as err:
        _resolve(text)
    problems = {(i["field"], i["message"]) for i in err.value.issues}
    assert ("compute.gpus", "asks for 1 nvidia.com/gpu in total; cluster queue 'local' and its cohort 'local' "
            "can never hold more than 0, so the run would never start") in problems
