"""How often the services fetch the platform's text per run, on a live embedded stack (issue 27/30).

Starts a simulated stack with Kueue's baseline platform, listens (as the stack's bootstrap identity) to the requests
every service sends for the ``platform`` bucket: direct gets of the current text
(``$JS.API.DIRECT.GET.KV_platform.$KV.platform.current``) and of the small ``local_user`` key, gets of a revision by
sequence (``$JS.API.DIRECT.GET.KV_platform``) and the stream-info marks ``PlatformReader`` asks before using the
text it holds (``$JS.API.STREAM.INFO.KV_platform``), runs the baseline scenario at ``--fraction`` and prints each
count per run. A text fetch costs the platform's size in bytes (577 KB for 1,000 queues); a mark about 1 KB.

Target (docs §16: the text is fetched once per revision by each reading process): the fetches of the text, current
and by sequence together, at most one per process of the stack and one for the scenario's client, however many
runs; marks are printed, with no target. Exits 1 when the target is missed.

    .venv/bin/python bench/platform_reads.py --fraction 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import msgspec
from kueue_scenario import drive, platform_yaml  # bench/ is this script's directory, first on sys.path
from pipeline import simulated_stack, stack_up

from taugrid.client import open_client
from taugrid.stack.scaling import SERVICES

TEXT_FETCHES_TARGET = len(SERVICES) + 1  # one per reading process (the platform is applied once, before the runs)

SUBJECTS = {"current text": "$JS.API.DIRECT.GET.KV_platform.$KV.platform.current",
            "local_user key": "$JS.API.DIRECT.GET.KV_platform.$KV.platform.local_user",
            "revision by sequence": "$JS.API.DIRECT.GET.KV_platform",
            "mark (stream info)": "$JS.API.STREAM.INFO.KV_platform"}


async def count(url: str, data: Path, fraction: float) -> tuple[dict[str, int], int]:
    admin = await open_client(url, creds=data / "creds" / "bootstrap.nk")
    counts = dict.fromkeys(SUBJECTS, 0)
    for name, subject in SUBJECTS.items():
        async def seen(_msg: Any, name: str = name) -> None:
            counts[name] += 1
        await admin.bus.nc.subscribe(subject, cb=seen)
    await admin.bus.nc.flush()
    before = dict(counts)
    user_creds = msgspec.json.decode((data / "stack.json").read_bytes())["user_creds"]
    result = await drive(url, fraction, creds=data / "creds" / "bootstrap.nk", user_creds=user_creds)
    await asyncio.sleep(5.0)  # the last runs' seals read the platform too
    await admin.close()
    return {k: counts[k] - before[k] for k in counts}, int(result["runs"])  # type: ignore[call-overload]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, default=0.01, help="share of Kueue's baseline run counts")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-platform-reads-")
    text = platform_yaml()
    with stack_up(data, env, tau, text) as url:
        counts, runs = asyncio.run(count(url, data, args.fraction))
    print(f"{runs} runs, platform {len(text.encode())} bytes")
    for name, n in counts.items():
        print(f"{name:<22} {n:>6}  {n / max(runs, 1):.2f} per run")
    fetches = counts["current text"] + counts["revision by sequence"]
    ok = fetches <= TEXT_FETCHES_TARGET and runs > 0
    print(f"{'text fetches in all':<22} {fetches:>6}  target ≤ {TEXT_FETCHES_TARGET} (one per reading process), "
          f"{runs} run(s) → {'met' if ok else 'MISSED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
