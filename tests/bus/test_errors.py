"""``bus/errors.py`` is the one table from nats-py's exceptions to taugrid's: no other module of ``taugrid.bus``
names a nats-py exception where it catches one, and the rows' answers hold against a real nats-server."""

from __future__ import annotations

import ast
import io
import uuid
from pathlib import Path

import nats
import pytest

import taugrid.bus
from taugrid.bus import Bus, connect, errors, kv, objects, replay, streams
from taugrid.core.errors import NotFound, TemporaryError

BUS = Path(taugrid.bus.__file__).parent


def _nats_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to nats-py's modules or classes by ``from nats… import x [as y]`` → their ``nats.…`` path
    (``from nats.js import errors as nats_errors`` hid ``nats_errors.NoKeysError`` from a check of ``nats.`` names)."""
    return {(a.asname or a.name): f"{node.module}.{a.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nats"
            for a in node.names}


def _nats_names_where_caught(tree: ast.AST) -> list[str]:
    """The ``nats.…`` classes named in an ``except`` clause's type, a ``suppress(…)`` or an ``isinstance(…)``, also
    through a name imported from nats-py."""
    aliases = _nats_aliases(tree)
    caught: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            caught.append(node.type)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "suppress", "isinstance"):
            caught.extend(node.args)
    named = [e for c in caught for e in (c.elts if isinstance(c, ast.Tuple) else [c])]
    out = set()
    for e in named:
        text = ast.unparse(e)
        head, _, rest = text.partition(".")
        text = f"{aliases[head]}.{rest}".rstrip(".") if head in aliases else text
        if isinstance(e, ast.Attribute | ast.Name) and text.startswith("nats."):
            out.add(text)
    return sorted(out)


def test_only_the_table_names_nats_exceptions_where_they_are_caught() -> None:
    found = {path.name: names for path in sorted(BUS.glob("*.py")) if path.name != "errors.py"
             if (names := _nats_names_where_caught(ast.parse(path.read_text())))}
    assert found == {}


def test_the_checker_sees_a_nats_class_in_each_place_it_looks() -> None:
    code = ("try:\n    pass\nexcept (nats.errors.Error, OSError):\n    pass\n"
            "with contextlib.suppress(nats.js.errors.NotFoundError):\n    pass\n"
            "isinstance(e, nats.errors.AuthorizationError)\n"
            "from nats.js import errors as nats_errors\nfrom nats.errors import TimeoutError as Late\n"
            "try:\n    pass\nexcept (nats_errors.NoKeysError, Late):\n    pass\n")
    assert _nats_names_where_caught(ast.parse(code)) == [
        "nats.errors.AuthorizationError", "nats.errors.Error", "nats.errors.TimeoutError", "nats.js.errors.NoKeysError",
        "nats.js.errors.NotFoundError"]


def test_a_lost_compare_and_set_is_told_by_class_or_by_the_servers_code() -> None:
    assert errors.conflicted(nats.js.errors.KeyWrongLastSequenceError())
    assert errors.conflicted(nats.js.errors.APIError(code=400, err_code=10071))
    assert not errors.conflicted(nats.js.errors.APIError(code=503, err_code=10008))
    assert not errors.conflicted(nats.errors.TimeoutError())


def test_unavailable_says_what_was_being_done_and_why() -> None:
    err = errors.unavailable("reading run_state/run.a.b", nats.errors.TimeoutError(), delay=2.0)
    assert type(err) is TemporaryError
    assert (str(err), err.delay) == ("reading run_state/run.a.b failed: TimeoutError()", 2.0)


async def test_what_is_not_there_is_answered_as_the_table_says(bus: Bus) -> None:
    name = f"absent-{uuid.uuid4().hex[:8]}"
    assert await kv.get(bus, "run_state", f"run.{name}") is None  # KEY_ABSENT
    await kv.delete(bus, "run_state", f"run.{name}")  # KEY_ABSENT: already deleted
    assert await streams.last(bus, "RUNS", f"run.{name}.>") is None  # MISSING: no message
    assert await streams.bounds(bus, f"NOSTREAM_{name}") == (0, 0)  # MISSING: no stream
    assert await objects.exists(bus, name) is False  # OBJECT_GONE
    assert await objects.read(bus, name) is None  # MISSING
    with pytest.raises(NotFound, match=f"object '{name}' is not in the object store"):
        await objects.download(bus, name, io.BytesIO())  # OBJECT_GONE
    with pytest.raises(TemporaryError, match=f"stream NOSTREAM_{name} not found"):
        await replay.replay(bus, stream=f"NOSTREAM_{name}", subject=f"x.{name}")  # MISSING, before the bus is set up


async def test_a_closed_connection_is_a_temporary_error(bootstrapped: str) -> None:
    closed = await connect(bootstrapped, name="errors-test")
    await closed.close()
    with pytest.raises(TemporaryError, match="reading run_state/run.x.y failed: ConnectionClosedError"):
        await kv.get(closed, "run_state", "run.x.y")  # UNAVAILABLE
