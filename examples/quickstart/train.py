"""Train a logistic-regression classifier with SGD on a synthetic two-moons-like dataset, on the CPU.

Writes a checkpoint every few epochs to $TAU_CHECKPOINT_DIR, metrics as JSON lines to $TAU_OUTPUT_DIR, and
resumes from $TAU_RESUME_FROM when the platform retries it. Pure Python: no framework needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path


def dataset(n: int, seed: int = 7) -> list[tuple[list[float], int]]:
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        label = rng.random() < 0.5
        angle = rng.uniform(0, math.pi)
        x = math.cos(angle) + (1.0 if label else 0.0) + rng.gauss(0, 0.15)
        y = math.sin(angle) * (-1 if label else 1) + (0.5 if label else 0.0) + rng.gauss(0, 0.15)
        # quadratic features make the moons separable by a linear model
        data.append(([1.0, x, y, x * x, y * y, x * y], int(label)))
    return data


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    out = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    ckpt_dir = Path(os.environ.get("TAU_CHECKPOINT_DIR", out / "checkpoints"))
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    attempt = os.environ.get("TAU_RETRY_ATTEMPT", "1")
    print(f"run {os.environ.get('TAU_RUN_ID', 'local')} attempt {attempt}", flush=True)

    weights, start = [0.0] * 6, 0
    resume = Path(os.environ.get("TAU_RESUME_FROM", "") or ckpt_dir) / "last.json"
    if resume.exists():
        state = json.loads(resume.read_text())
        weights, start = state["weights"], state["epoch"]
        print(f"resumed from {resume} at epoch {start}", flush=True)

    train, test = dataset(600), dataset(200, seed=11)

    def accuracy() -> float:
        return sum((sigmoid(sum(w * f for w, f in zip(weights, x))) > 0.5) == bool(y) for x, y in test) / len(test)

    acc = accuracy()
    rng = random.Random(start)
    with open(out / "metrics.jsonl", "a") as metrics:
        for epoch in range(start, args.epochs):
            rng.shuffle(train)
            loss = 0.0
            for feats, label in train:
                p = sigmoid(sum(w * f for w, f in zip(weights, feats)))
                loss -= math.log(p + 1e-12) if label else math.log(1 - p + 1e-12)
                for i, f in enumerate(feats):
                    weights[i] -= args.lr * (p - label) * f
            acc = accuracy()
            row = {"_step": epoch + 1, "_timestamp": time.time(), "loss": loss / len(train), "accuracy": acc}
            metrics.write(json.dumps(row) + "\n")
            print(f"epoch {epoch + 1:3d}  loss {row['loss']:.4f}  test accuracy {acc:.3f}", flush=True)
            if (epoch + 1) % 5 == 0 or epoch + 1 == args.epochs:
                tmp = ckpt_dir / "last.json.tmp"
                tmp.write_text(json.dumps({"epoch": epoch + 1, "weights": weights}))
                tmp.replace(ckpt_dir / "last.json")
    print(f"done: final test accuracy {acc:.3f}", flush=True)


if __name__ == "__main__":
    main()
