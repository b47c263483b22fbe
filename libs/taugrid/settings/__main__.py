"""``python -m taugrid.settings``: every variable taugrid reads, as the Markdown table of docs/architecture.md §14
(tests/test_settings.py keeps the two equal), then the names taugrid only hands down to the processes it starts."""

from __future__ import annotations

from taugrid.settings.model import HANDED_DOWN, HANDED_DOWN_PREFIXES, variables
from taugrid.settings.parse import describe


def table() -> str:
    rows = ["| Variable | Setting | Takes | Default | Why |", "|---|---|---|---|---|"]
    rows += [f"| `{var.env}` | `{group}.{name}` | {var.parse.kind} | {describe(default)} | {var.why} |"
             for group, name, var, default in variables()]
    return "\n".join(rows)


def handed_down() -> str:
    rows = ["| Handed down | To the process it starts: |", "|---|---|"]
    rows += [f"| `{name}` | {why} |" for name, why in HANDED_DOWN.items()]
    rows += [f"| `{prefix}*` | {why} |" for prefix, why in HANDED_DOWN_PREFIXES.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
    print()
    print(handed_down())
