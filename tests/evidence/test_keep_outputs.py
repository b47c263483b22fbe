"""Small output files kept in the object store by the evidence service, and `tau outputs --copy` fetching them
where the run's directory is not on this machine (Kubernetes: a volume the CLI cannot reach)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from taugrid.bus import Bus
from taugrid.evidence import bundle as b
from taugrid.evidence import ledger as lg
from taugrid.evidence import store
from taugrid.settings import SettingsError

outputs_cmd = importlib.import_module("taugrid.cli.outputs_cmd")


def _files(root: Path) -> None:
    (root / "ckpt").mkdir(parents=True)
    (root / "result.json").write_text('{"acc": 0.9}')
    (root / "copy.json").write_text('{"acc": 0.9}')  # same content: one object
    (root / "ckpt" / "big.pt").write_bytes(b"\0" * 5000)


def test_keeper_copies_small_files_within_the_budget_by_content(tmp_path: Path) -> None:
    _files(tmp_path)
    keeper = b.Keeper("r1", budget=100)
    found = b.scan_dir(str(tmp_path), metrics=False, keeper=keeper)
    digest = lg.sha256(b'{"acc": 0.9}')
    assert found["files"] == [
        {"path": "ckpt/big.pt", "size": 5000, "sha256": lg.sha256(b"\0" * 5000)},
        {"path": "copy.json", "size": 12, "sha256": digest, "object": f"runs/r1/outputs/{digest}"},
        {"path": "result.json", "size": 12, "sha256": digest, "object": f"runs/r1/outputs/{digest}"},
    ]
    assert keeper.blobs == {f"runs/r1/outputs/{digest}": b'{"acc": 0.9}'} and keeper.budget == 88
    assert "object" not in b.scan_dir(str(tmp_path), metrics=False)["files"][1]  # no keeper: nothing kept


@pytest.mark.parametrize(("raw", "budget"), [("", 0), ("64Mi", 64 << 20), ("1000", 1000)])
def test_keep_budget_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str, budget: int) -> None:
    monkeypatch.setenv("TAU_EVIDENCE_KEEP_OUTPUTS", raw)
    assert store.keep_outputs_budget() == budget


def test_a_keep_budget_that_is_no_quantity_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAU_EVIDENCE_KEEP_OUTPUTS", "lots")
    with pytest.raises(SettingsError) as refused:
        store.keep_outputs_budget()
    assert str(refused.value) == (
        "TAU_EVIDENCE_KEEP_OUTPUTS='lots': must be a size in bytes, e.g. 64Mi or 1G (memory 'lots' is not a "
        "quantity (examples: 2, 500m, 64Gi)); set e.g. TAU_EVIDENCE_KEEP_OUTPUTS=64Mi, or unset it for the "
        "default (0)")


async def test_copy_fetches_kept_files_from_the_object_store_and_names_the_rest(bus: Bus, tmp_path: Path) -> None:
    _files(tmp_path / "run")
    keeper = b.Keeper("r-copy", budget=100)
    listing = {**b.scan_dir(str(tmp_path / "run"), metrics=False, keeper=keeper), "path": "/data/runs/ws/r-copy"}
    for name, blob in keeper.blobs.items():
        await store.put_object(bus, name, blob, workspace="ws")
    found = {
        "output_dir": {**listing, "on_this_machine": False},
        "checkpoint_dir": {"path": "/data/runs/ws/r-copy/ckpt", "files": [], "present": False,
                           "on_this_machine": False},
    }
    copied, missing = await outputs_cmd._fetch(SimpleNamespace(bus=bus), found, tmp_path / "dest")
    assert copied == 2 and missing == ["/data/runs/ws/r-copy/ckpt/big.pt"]
    assert (tmp_path / "dest" / "result.json").read_text() == '{"acc": 0.9}'
    assert (tmp_path / "dest" / "copy.json").read_text() == '{"acc": 0.9}'
    assert not (tmp_path / "dest" / "ckpt" / "big.pt").exists()
