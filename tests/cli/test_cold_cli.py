"""`tau` starts cold: its entry point imports no bus client, platform models, evidence store or Kubernetes
client until a command needs them, and `tau --help` lists commands from a table kept equal to theirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from taugrid.cli.main import COMMANDS, cli

HEAVY = ("nats", "pydantic", "taugrid.evidence.store", "taugrid.config.platform", "kubernetes_asyncio")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint('loaded:', *(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(out.splitlines()[-1].split()[1:])


def test_the_entry_point_and_its_help_import_nothing_heavy() -> None:
    assert _loaded_after("import taugrid.cli.main") == set()
    assert _loaded_after("from taugrid.cli.main import cli\ncli(['--help'], standalone_mode=False)") == set()


def test_offline_validation_loads_the_config_models_but_no_bus_client(tmp_path: Path) -> None:
    (tmp_path / "tau.yaml").write_text("name: t\nrun:\n  entrypoint: echo hi\n")
    code = f"from taugrid.cli.main import cli\ncli(['run', 'validate', '--offline', {str(tmp_path)!r}], " \
           "standalone_mode=False)"
    assert _loaded_after(code) == {"pydantic", "taugrid.config.platform"}  # it checks the machine's platform


def test_the_help_table_matches_every_commands_own_short_help() -> None:
    ctx = click.Context(cli)
    for name, (_module, _attr, short) in COMMANDS.items():
        cmd = cli.get_command(ctx, name)
        assert cmd is not None and cmd.name == name
        assert cmd.get_short_help_str(limit=45) == short, (
            f"tau {name}: update its short help in taugrid/cli/main.py COMMANDS")
