"""The evidence archive on a `tau up` stack, through the real CLI: a platform that names an archive directory moves
each sealed run's bundle there; `tau verify` and `tau evidence --save` read it from there; a changed archive fails
`tau verify` naming it. Its own stack (the session's platform keeps evidence on the bus)."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from taugrid.core.ids import token
from taugrid.evidence import packing
from tests.e2e.conftest import TEST_PLATFORM, Stack, reachable_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    d = reachable_dir("tau-e2e-archive-")
    try:
        s = Stack(d, tmp_path_factory.mktemp("operator"))
        s.tau("up", check=True, timeout=90)
        archive = d / "archive"
        platform = d / "platform.yaml"
        platform.write_text(TEST_PLATFORM.replace("{outputs}", str(d / "outputs"))
                            + f"retention:\n  evidence:\n    archive: {{directory: {archive}}}\n")
        applied = s.tau("platform", "apply", str(platform), check=True).stdout
        assert "note: the evidence archive applies from the next seal" in applied
        yield s, archive
        s.tau("down", timeout=60)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_sealed_run_is_verified_and_exported_from_the_archive(archived: tuple[Stack, Path], tmp_path: Path
                                                                ) -> None:
    stack, archive = archived
    proc = stack.tau("run", str(REPO / "examples" / "quickstart"), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    stack.wait_sealed(run_id)
    bundle = archive / "runs" / token(run_id) / "bundle.json"
    for _ in range(100):  # moved right after evidence.sealed is published
        if bundle.exists():
            break
        time.sleep(0.1)

    human = stack.tau("verify", run_id, check=True).stdout.splitlines()
    assert human[1] == f"  bundle read from the evidence archive, directory {archive} (the bus keeps its digest)"
    report = stack.json("verify", run_id)
    assert (report["ok"], report["problems"], report["archive"]) == (True, [], f"directory {archive}")
    saved = tmp_path / "bundle.json"
    stack.tau("evidence", run_id, "--save", str(saved), check=True)
    # the exact sealed bytes, read from the archive with the workspace's base it is stored against (also archived)
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == report["digest"]
    base = packing.base_of(bundle.read_bytes())
    assert base.startswith("bases/") and (archive / base).is_file()

    bundle.chmod(0o640)
    bundle.write_bytes(gzip.compress(saved.read_bytes().replace(b'"exit_code":0', b'"exit_code":7'), mtime=0))
    failed = stack.tau("verify", run_id, "--output", "json")
    assert failed.returncode != 0
    assert f"(the bundle was modified in the archive, directory {archive})" in failed.stdout
