"""Outputs in plain sight: `tau status` shows the output and checkpoint directories with their files,
`tau outputs` lists and copies them, and files written to the scratch working directory are called out."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import Stack, write_project

REPO = Path(__file__).resolve().parents[2]


def test_outputs_of_the_quickstart_are_listed_shown_and_copied(stack: Stack, tmp_path: Path) -> None:
    proc = stack.tau("run", str(REPO / "examples" / "quickstart"), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    out_dir = stack.data_dir / "outputs" / "default" / run_id
    assert f"  outputs:     {out_dir}  (1 file(s), " in proc.stdout  # --follow ends with where things are
    stack.wait_sealed(run_id)

    found = stack.json("outputs", run_id)
    assert (found["source"], found["state"], found["scratch"]) == ("evidence", "succeeded", [])
    assert found["output_dir"]["path"] == str(out_dir) and found["output_dir"]["on_this_machine"] is True
    assert [f["path"] for f in found["output_dir"]["files"]] == ["checkpoints/last.json", "metrics.jsonl"]
    assert found["checkpoint_dir"]["path"] == str(out_dir / "checkpoints")
    assert [f["path"] for f in found["checkpoint_dir"]["files"]] == ["last.json"]

    human = stack.tau("status", run_id, check=True).stdout.splitlines()
    outputs_line = next(line for line in human if line.startswith("  outputs:"))
    assert outputs_line.startswith(f"  outputs:     {out_dir}  (1 file(s), ") and outputs_line.endswith(
        ": metrics.jsonl)"
    )
    assert any(
        line.startswith(f"  checkpoints: {out_dir / 'checkpoints'}  (1 file(s), ") and line.endswith(": last.json)")
        for line in human
    )
    assert stack.json("status", run_id)["outputs"]["output_dir"]["path"] == str(out_dir)

    dest = tmp_path / "copy"
    copied = stack.tau("outputs", run_id, "--copy", str(dest), check=True).stdout
    assert copied.splitlines()[-1] == f"copied 2 file(s) to {dest}"
    assert (dest / "metrics.jsonl").read_bytes() == (out_dir / "metrics.jsonl").read_bytes()
    assert (dest / "checkpoints" / "last.json").read_bytes() == (out_dir / "checkpoints" / "last.json").read_bytes()
    assert stack.tau("outputs", "no-such-run").returncode == 3


def test_files_written_to_the_scratch_working_directory_are_called_out(stack: Stack, tmp_path: Path) -> None:
    script = "import os\nopen('model.pt', 'w').write('w')\nprint('saved model.pt')\n"
    config = write_project(tmp_path, "scratchy", script, "name: scratchy\nentrypoint: main.py\n")
    proc = stack.tau("run", str(config), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    stack.wait_sealed(run_id)
    work = stack.data_dir / "pods" / f"{run_id}-a1-pod" / "volumes" / "tau-source"  # the source volume
    out_dir = stack.data_dir / "outputs" / "default" / run_id
    warning = (
        f"wrote 1 file(s) under the run's working directory, which is scratch ({work}): model.pt; "
        f"write to $TAU_OUTPUT_DIR ({out_dir}) to keep them with the run"
    )
    assert f"  ! {warning}" in stack.tau("status", run_id, check=True).stdout.splitlines()
    assert f"taugrid: {warning}" in stack.tau("logs", run_id, check=True).stdout.splitlines()
    assert stack.json("outputs", run_id)["scratch"] == [
        {"pod": f"{run_id}-a1-pod", "work_dir": str(work), "count": 1, "files": ["model.pt"]}
    ]
