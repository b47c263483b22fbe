"""Ray tasks on a CPU: square numbers in parallel and write the sum to $TAU_OUTPUT_DIR/result.json.

Without Ray in the run's Python it says how to get it and exits 0 (skipped), so the example never fails
for a missing optional package.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    try:
        import ray
    except ModuleNotFoundError:
        print(f"skipped: Ray is not installed in {sys.executable}; pip install ray, then run this again",
              flush=True)
        return 0
    ray.init(num_cpus=2, include_dashboard=False)

    @ray.remote
    def square(x: int) -> int:
        return x * x

    total = sum(ray.get([square.remote(i) for i in range(10)]))
    out = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"sum_of_squares": total}))
    print(f"done: sum of squares 0..9 = {total}", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
