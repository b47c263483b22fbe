"""Removing a run's pod directories once its evidence is sealed: the project copy, the logs (already shipped to
LOGS and sealed), the sealed spec, volumes, and its secret volumes in ``/dev/shm``. Outputs live under the
workspace's output root and are kept.

Only a directory whose ``pod.json`` names the run (label ``taugrid.io/run-id``) and whose shim reported it done
is removed, so a pod that still stops (a cancel within its grace period) or another run's pod is left alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from taugrid.local.podspec import secret_volumes_dir


def remove_finished_pods(pods_dir: Path, run_id: str) -> list[str]:
    """Remove ``run_id``'s finished pod directories under ``pods_dir``; returns their names."""
    removed: list[str] = []
    try:
        candidates = sorted(p for p in pods_dir.iterdir() if p.name.startswith(f"{run_id}-"))
    except OSError:
        return removed
    for pod_dir in candidates:
        try:
            manifest = json.loads((pod_dir / "pod.json").read_text())
            state = json.loads((pod_dir / "state.json").read_text())
        except (OSError, ValueError):
            continue
        labels = (manifest.get("metadata") or {}).get("labels") or {}
        if labels.get("taugrid.io/run-id") != run_id or not state.get("done"):
            continue
        secrets = secret_volumes_dir(pod_dir)
        if not secrets.is_relative_to(pod_dir):
            shutil.rmtree(secrets, ignore_errors=True)
        shutil.rmtree(pod_dir, ignore_errors=True)
        removed.append(pod_dir.name)
    return removed
