"""Entry point: ``tau``.

Cold start matters (every ``tau`` invocation, and many tests, pay it): the command modules import the bus
client, pydantic models and the evidence store, so they load only when their command runs. ``tau --help``
lists the commands from the short help below, which ``tests/cli/test_cold_cli.py`` keeps equal to each
command's own.
"""

from __future__ import annotations

import importlib

import click

from taugrid import __version__

# name → (module, attribute, the command's short help as `tau --help` shows it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "admin": ("identity_cmd", "admin", "Platform administration: people and their..."),
    "cancel": ("runs", "cancel", "Cancel a run: its process gets SIGTERM,..."),
    "clusters": ("clusters_cmd", "clusters", "Show the clusters runs are dispatched to:..."),
    "completion": ("completion", "completion", "Print the shell completion script for SHELL."),
    "diagnose": ("diagnose_cmd", "diagnose", "Why a run failed (or where it stands):..."),
    "dlq": ("dlq_cmd", "dlq", "Dead letters: events a service refused or..."),
    "down": ("stack", "down", "Stop the embedded stack: services drain,..."),
    "events": ("events_cmd", "events", "Replay run events from the stream (the..."),
    "evidence": ("evidence_cmd", "evidence", "Show a run's sealed evidence bundle..."),
    "list": ("runs", "list_runs", "List runs, newest first: AGE is the time..."),
    "login": ("identity_cmd", "login", "Store credentials for a remote taugrid..."),
    "logs": ("runs", "logs", "Print a run's output, every attempt (each..."),
    "nodes": ("nodes_cmd", "nodes", "Show nodes: GPUs (vendor/model), health..."),
    "outputs": ("outputs_cmd", "outputs", "List a run's output and checkpoint files;..."),
    "portal": ("portal_cmd", "portal", "Print a sign-in link to the web portal..."),
    "platform": ("platform_cmd", "platform", "Govern workspaces, queues, quotas, compute..."),
    "queue": ("queue_cmd", "queue", "Show ClusterQueues: nominal, used,..."),
    "reproduce": ("reproduce_cmd", "reproduce", "Re-run RUN exactly from its sealed..."),
    "run": ("runs", "run", "Submit a run: `tau run [TARGET]` (a..."),
    "scale": ("stack", "scale", "Change replica counts of a running stack's..."),
    "stack": ("stack", "stack_status", "Show the embedded stack: NATS URL, data..."),
    "status": ("runs", "status", "Show a run's phase tree: submitted →..."),
    "top": ("top_cmd", "top", "A live view of queues, runs and nodes that..."),
    "up": ("stack", "up", "Start the embedded stack in the..."),
    "usage": ("usage_cmd", "usage", "GPU-seconds, queue wait, run time and..."),
    "verify": ("evidence_cmd", "verify", "Re-verify a run's evidence: bundle digest,..."),
    "whoami": ("identity_cmd", "whoami", "Who the bus knows you as: user, role and..."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use; its help lists them without importing any."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr, _ = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(f"taugrid.cli.{module}"), attr), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2] if name not in self.commands else
                 self.commands[name].get_short_help_str(limit=45)) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tau")
def cli() -> None:
    """taugrid: run AI workloads on GPU clusters. Start with `tau up`, then `tau run . --follow` in a
    project folder holding a tau.yaml."""


def main() -> None:
    cli(prog_name="tau")


if __name__ == "__main__":
    main()
