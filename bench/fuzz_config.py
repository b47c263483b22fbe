"""Fuzz the config parsers at volume: 10,000 generated tau.yaml documents (through policy's resolution too) and
10,000 platform.yaml documents by default (tests/config/fuzzdocs.py). Prints the outcomes and the rate; exits 1
if any document crashed the parser or came back with an issue lacking its field or fix."""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from taugrid.config.taujob import tau_json_schema  # noqa: E402
from tests.config.fuzzdocs import document  # noqa: E402
from tests.config.test_fuzz import PLATFORM_SCHEMA, TAU_BASE, check_platform, check_tau  # noqa: E402


def run(name: str, strategy, check, cases: int) -> bool:  # type: ignore[no-untyped-def]
    outcomes: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()

    @settings(max_examples=cases, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def one(text: str) -> None:
        outcomes[check(text)] += 1

    try:
        one()
        ok = True
    except Exception as exc:  # noqa: BLE001 - the failing document is in the report
        print(f"{name}: FAILED: {exc!r}"[:2000])
        ok = False
    took = time.perf_counter() - started
    total = sum(outcomes.values())
    print(f"{name}: {total} documents in {took:.1f} s ({total / took:.0f}/s): "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + f"  target: ≥ {cases}, no crash")
    return ok and total >= cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=10_000, help="documents per parser")
    args = parser.parse_args()
    ok = run("tau.yaml", document(tau_json_schema(), base=TAU_BASE), check_tau, args.cases)
    ok = run("platform.yaml", document(PLATFORM_SCHEMA), check_platform, args.cases) and ok
    print("fuzz: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
