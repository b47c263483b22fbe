"""The checkpoint step a resize names, read from the checkpoint directory's entry names (``local/checkpoints.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taugrid.local.checkpoints import checkpoint_dir, latest_step, step_of


@pytest.mark.parametrize(("name", "step"), [
    ("step-120", 120), ("step_000120.pt", 120), ("epoch=2-step=120.ckpt", 120), ("checkpoint-500", 500),
    ("global_step100", 100), ("ckpt_40", 40), ("model-step7.safetensors", 7), ("STEP-3", 3),
    ("latest", None), ("epoch=2.ckpt", None), ("config.json", None),
    (".step-130.pt", None), ("step-130.pt.tmp", None), ("step-130.partial", None),  # still being written
])
def test_a_checkpoints_name_gives_its_step(name: str, step: int | None) -> None:
    assert step_of(name) == step


def test_the_highest_step_in_the_directory_counts(tmp_path: Path) -> None:
    for name in ("step-5.pt", "step-40.pt", "step-15.pt", "latest", ".step-45.pt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoint-30").mkdir()
    assert latest_step(str(tmp_path)) == 40


def test_no_checkpoint_or_no_directory_says_none(tmp_path: Path) -> None:
    assert latest_step(str(tmp_path)) is None
    assert latest_step(str(tmp_path / "absent")) is None
    assert latest_step("") is None


def test_the_checkpoint_directory_is_the_one_the_jobs_main_container_is_given() -> None:
    job = {"kind": "Job", "spec": {"template": {"spec": {"containers": [
        {"name": "main", "env": [{"name": "TAU_OUTPUT_DIR", "value": "/o"}, {"name": "TAU_CHECKPOINT_DIR",
                                                                           "value": "/o/checkpoints"}]}]}}}}
    assert checkpoint_dir(job) == "/o/checkpoints"
    assert checkpoint_dir({"kind": "Job", "spec": {"template": {"spec": {"containers": [{"name": "main"}]}}}}) == ""
