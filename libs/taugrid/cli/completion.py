"""``tau completion bash|zsh|fish``: the shell completion script click generates for ``tau``."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")


@click.command(
    help="Print the shell completion script for SHELL. Enable it with, e.g., "
    '`eval "$(tau completion bash)"` in ~/.bashrc (zsh: ~/.zshrc; fish: '
    "`tau completion fish > ~/.config/fish/completions/tau.fish`)."
)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    cls = get_completion_class(shell)
    assert cls is not None  # every name in SHELLS is one click ships
    root = ctx.find_root().command
    click.echo(cls(root, {}, "tau", "_TAU_COMPLETE").source())
