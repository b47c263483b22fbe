"""Entry point: ``tau``."""

from __future__ import annotations

import click

from taugrid import __version__
from taugrid.cli.completion import completion
from taugrid.cli.dlq_cmd import dlq
from taugrid.cli.evidence_cmd import evidence, verify
from taugrid.cli.identity_cmd import admin, login, whoami
from taugrid.cli.outputs_cmd import outputs
from taugrid.cli.platform_cmd import platform
from taugrid.cli.queue_cmd import queue
from taugrid.cli.runs import cancel, events, list_runs, logs, run, status
from taugrid.cli.stack import down, scale, stack_status, up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tau")
def cli() -> None:
    """taugrid: run AI workloads on GPU clusters. Start with `tau up`, then `tau run . --follow` in a
    project folder holding a tau.yaml."""


for command in (
    up, down, scale, stack_status, run, status, outputs, logs, list_runs, cancel, events, platform, evidence,
    verify, queue, completion, login, whoami, admin, dlq,
):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="tau")


if __name__ == "__main__":
    main()
