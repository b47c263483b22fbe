"""A learning-rate sweep over examples/quickstart: one run per value, submitted together, then a table.

    python examples/sweep/sweep.py                  # lr 0.01 0.05 0.1 0.3 on the running stack (`tau up`)
    python examples/sweep/sweep.py --lr 0.1 0.5 --epochs 10

Each trial is the quickstart's tau.yaml with its own name and args, submitted through the Python client
(`Client.submit(..., config_text=...)`); the project snapshot is shared, so it is stored once. Results come
from each run's sealed evidence bundle (its metrics.jsonl), so this works the same on Kubernetes. Exit 0 only
when every trial succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from taugrid.cli.common import nats_url
from taugrid.client import Client, open_client
from taugrid.evidence.store import read_bundle

PROJECT = Path(__file__).resolve().parents[1] / "quickstart"


def variant(base: dict[str, Any], *, lr: float, epochs: int) -> str:
    trial = {**base, "name": f"sweep-lr{lr:g}".replace(".", "p"), "args": ["--epochs", str(epochs), "--lr", str(lr)]}
    trial["experiment"] = {**base.get("experiment", {}), "group": "lr-sweep"}
    return yaml.safe_dump(trial, sort_keys=False)


async def result(client: Client, run_id: str) -> tuple[str, float | None]:
    """The run's final state and last test accuracy, once its evidence is sealed."""
    async for _ in client.follow(run_id):
        pass
    record = await client.settled(run_id)
    got = await read_bundle(client.bus, run_id)
    metrics = (got[1]["outputs"]["output_dir"].get("metrics") or []) if got else []
    rows = [json.loads(line) for m in metrics for line in m["text"].splitlines() if line.strip()]
    return record.state, (rows[-1]["accuracy"] if rows else None)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.3])
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    base = yaml.safe_load((PROJECT / "tau.yaml").read_text())
    client = await open_client(nats_url())
    try:
        runs = [
            (lr, await client.submit(PROJECT / "tau.yaml", config_text=variant(base, lr=lr, epochs=args.epochs)))
            for lr in args.lr
        ]
        for lr, run_id in runs:
            print(f"submitted {run_id}  lr={lr:g}", flush=True)
        results = await asyncio.gather(*(result(client, run_id) for _, run_id in runs))
    finally:
        await client.close()
    print(f"\n{'RUN':<28} {'LR':>6}  {'STATE':<10} ACCURACY")
    for (lr, run_id), (state, acc) in zip(runs, results, strict=True):
        print(f"{run_id:<28} {lr:>6g}  {state:<10} {'-' if acc is None else f'{acc:.3f}'}")
    best = max(((acc, lr) for (lr, _), (_, acc) in zip(runs, results, strict=True) if acc is not None), default=None)
    if best:
        print(f"best: lr={best[1]:g} (accuracy {best[0]:.3f})")
    return 0 if all(state == "succeeded" for state, _ in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
