"""ResolvedRun builder for the renderer tests: a run as policy would hand it over (plain module, no fixtures)."""

from __future__ import annotations

from typing import Any

from taugrid.core.contracts import ResolvedRun


def build_run(**overrides: Any) -> ResolvedRun:
    fields: dict[str, Any] = {
        "run_id": "train-3f9a1c",
        "submission_id": "18f0c2a9b1d4e5f6a7b8",
        "workspace": "team-a",
        "namespace": "team-a",
        "name": "train",
        "local_queue": "team-a-lq",
        "cluster_queue": "team-a-cq",
        "config_hash": "sha256:0c1d2e3f",
        "source_digest": "sha256:a1b2c3d4",
        "source_object": "sources/team-a/a1b2c3d4.tar.gz",
        "command": ["python3", "train.py"],
        "entrypoint": "train.py",
    }
    fields.update(overrides)
    return ResolvedRun(**fields)
