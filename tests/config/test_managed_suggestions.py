"""The did-you-mean of a managed manifest's unknown keys (``config.managed.suggest_path``, TauGrid's rule) gives the
answer of the rule's full edit-distance tables while measuring only what can still come within its limit, so a
hostile manifest costs the client and the submitter little: a 1 KB manifest with one 1,000-character unknown
key took 15 s of the submitter's CPU before, one of 3,000 unknown keys under a 10-character one 87 s."""

from __future__ import annotations

import random
import time

from taugrid.config import managed
from taugrid.config.taujob import _direct_paths, load_tau_config

DIRECT = _direct_paths()
CANDIDATES = sorted({p for p in DIRECT if not DIRECT[p]} | {p for p, d in managed.MANAGED_PATHS.items() if not d})
ALPHABET = "abcdefghijklmnopqrstuvwxyz_."


def full_table(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(cur[j - 1] + 1, prev[j] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def rule(path: str) -> str | None:
    """TauGrid's rule as written: every candidate measured in full."""
    leaf, depth = path.rsplit(".", 1)[-1], path.count(".")
    best, best_d, best_pd = None, -1, -1
    for cand in CANDIDATES:
        pd = d = full_table(path, cand)
        if cand.count(".") == depth:
            d = min(d, full_table(leaf, cand.rsplit(".", 1)[-1]))
        if best is None or d < best_d or (d == best_d and pd < best_pd):
            best, best_d, best_pd = cand, d, pd
    return best if best is not None and best_d <= min(max(len(leaf) // 3, 2), 6) else None


def typo(rnd: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rnd.randint(0, 5)):
        i, op = rnd.randrange(len(chars) + 1), rnd.random()
        if op < 0.33 and chars:
            chars.pop(min(i, len(chars) - 1))
        elif op < 0.66:
            chars.insert(i, rnd.choice(ALPHABET))
        elif chars:
            chars[min(i, len(chars) - 1)] = rnd.choice(ALPHABET)
    return "".join(chars).strip(".") or "x"


def test_the_suggestions_are_the_full_rules() -> None:
    rnd = random.Random(29)
    paths = [typo(rnd, rnd.choice(CANDIDATES)) for _ in range(1500)]
    paths += ["".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 30))).strip(".") or "y" for _ in range(300)]
    got = {p: managed.suggest_path(p, CANDIDATES) for p in paths}
    assert got == {p: rule(p) for p in paths}
    assert sum(v is not None for v in got.values()) > 500  # the sample reaches suggestions, not only misses


def test_a_hostile_manifest_of_unknown_keys_is_read_at_once() -> None:
    head = "schema_version: 1\nname: t\nrun: {entrypoint: t.py, workload_kind: job}\n"
    for parent, children in (("k" * 1000, 5), ("k" * 10, 3000), ("computee", 3000)):
        text = head + parent + ":\n" + "".join(f"  gpuz{i}: 1\n" for i in range(children))
        started = time.monotonic()
        cfg = load_tau_config(text)
        assert time.monotonic() - started < 5.0, (parent[:12], children)
        [unknown] = [w for w in cfg.warnings if w.get("kind") == "unknown"]
        assert unknown["field"] == parent
