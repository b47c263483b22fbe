"""Shared CLI plumbing: output modes, exit codes, error rendering, connecting to the stack."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from taugrid.core.errors import ConfigError, NotFound, PermanentError, PermissionDenied, TauError, TemporaryError

P = ParamSpec("P")
R = TypeVar("R")

# Exit codes: 0 ok, 1 the run failed / check failed, 2 usage or invalid input, 3 not found,
# 4 the platform is unreachable, 5 rejected by policy.
EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_REJECTED = 1, 2, 3, 4, 5
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away

if TYPE_CHECKING:
    from taugrid.client import Client


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[Client]:
    """A client of the bus (see ``taugrid.client.locate``: env, `tau login`, the running stack), closed after use."""
    from taugrid.client import open_client

    client = await open_client(nats_url())
    try:
        yield client
    finally:
        await client.close()


output_option = click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format; json for scripts.",
)


def data_dir() -> Path:
    from taugrid.client.locate import data_dir as located

    return located()


def nats_url() -> str:
    from taugrid.client.locate import bus_url

    return bus_url()


def color(text: str, fg: str) -> str:
    return click.style(text, fg=fg) if sys.stdout.isatty() else text


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=None, default=str))


def fail(message: str, code: int) -> None:
    click.echo(color("error: ", "red") + message, err=True)
    sys.exit(code)


def run_async(fn: Callable[P, Awaitable[R]]) -> Callable[P, R]:
    """Run an async command; turn library errors into one message and an exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]
        except ConfigError as err:
            fail(str(err), EXIT_USAGE)
        except NotFound as err:
            fail(str(err), EXIT_NOT_FOUND)
        except PermissionDenied as err:
            fail(str(err), EXIT_REJECTED)
        except TemporaryError as err:
            fail(f"{err} (is the stack up? start it with `tau up`, or set TAU_NATS_URL)", EXIT_UNAVAILABLE)
        except PermanentError as err:
            fail(str(err), EXIT_USAGE)
        except TauError as err:
            fail(str(err), EXIT_FAILED)
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            closed_pipe()
        raise AssertionError("unreachable")

    return wrapper


def closed_pipe() -> None:
    """The reader went away (``tau events | head``): stop quietly, as ``cat`` would."""
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail loudly
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_CLOSED_PIPE)
