"""DistributedDataParallel on CPU: torchrun starts 2 processes, which sync gradients over gloo.

Each rank fits a tiny linear model on its own shard of a synthetic regression problem; rank 0 writes the
result to $TAU_OUTPUT_DIR/result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
except ModuleNotFoundError:
    print(f"torch is not installed in {sys.executable}: pip install torch==2.13.0 (the CPU wheel), "
          "or submit from an environment that has it", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    true_w = torch.tensor([[2.0], [-3.0]])
    x = torch.randn(256, 2, generator=torch.Generator().manual_seed(rank))
    y = x @ true_w + 0.01 * torch.randn(256, 1)
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP all-reduces the gradients across the ranks here
        opt.step()
        if rank == 0 and (step + 1) % 5 == 0:
            print(f"step {step + 1}  loss {loss.item():.4f}  world {world}", flush=True)
    if rank == 0:
        weights = model.module.weight.detach().flatten().tolist()
        out = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"world_size": world, "weights": weights}))
        print(f"done: world {world}, weights {[round(w, 2) for w in weights]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
