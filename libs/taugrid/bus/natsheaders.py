"""nats-py's header-block parser, the same function without its per-character generator.

nats-py parses the headers of every message it receives (``Client._parse_header_lines``) before handing it
over, and spends most of that time checking each header name for whitespace one character at a time through a
generator. A CloudEvent carries a dozen headers, so that check was the largest single cost of a long replay
(``tau events``: about half of its CPU) and a few percent of every service's. ``parse_header_lines`` returns
exactly what the original returns for any input (tests/bus/test_natsheaders.py compares them on arbitrary
bytes); ``install`` puts it in place once, from ``taugrid.bus.connection``, and only while nats-py still ships the
parser it replaces (its docstring is checked), so an upgrade that changes that parser keeps its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import repeat
from operator import contains

import msgspec
from nats.aio.client import Client

_CRLF = b"\r\n"
_WHITESPACE = re.compile(r"\s")  # on a str, the characters for which str.isspace() is true
_ORIGINAL = Client.__dict__["_parse_header_lines"]
# The first line of the docstring of the nats-py parser this one was checked against (nats-py 2.16).
_REPLACES = "Parse a NATS message-header block (`Name: Value\\r\\n` per line)."


# The block every NATS client writes (``Name: Value\r\n`` lines of printable ASCII, names without spaces or
# colons, values without surrounding blanks), checked with one C-level regular expression pass, decoded once and
# split on its line ends and each line on its first ``": "``; any other block goes through the line by line
# reading below. On such a block both give the same: a name is the text before the first colon (so before the
# first ``": "``) and has nothing to strip; the value is the rest less one space, with nothing else to strip;
# the only empty lines are the block's last ones.
# Possessive quantifiers (Python 3.11): a value is runs of printable non-blanks joined by runs of spaces, matched
# without backtracking (half the time of the backtracking form, which accepts the same blocks).
_NAME = rb"[!-9;-~]++"
_VALUE = rb"(?:[!-~]++(?: ++[!-~]++)*+)?+"
_PLAIN_BLOCK = re.compile(rb"(?:" + _NAME + rb": " + _VALUE + rb"\r\n)*+(?:\r\n)*+")


def parse_header_lines(raw: bytes) -> dict[str, str]:
    if _PLAIN_BLOCK.fullmatch(raw) is not None:
        return dict(line.split(": ", 1) for line in raw.decode("ascii").split("\r\n") if line)
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if _WHITESPACE.search(key) is not None:
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


# What a batch of blocks may hold: printable ASCII but the backslash a JSON string escapes, and line ends. A quote
# is allowed only as the joints' (each block is looked at before the join, by ``memchr``: a count of the joined
# batch's quotes went byte by byte and cost ten times as much). Checked as ASCII without a backslash or DEL, each a
# single C pass; a control character (a tab, a lone CR or LF) is left to the JSON reader, which refuses one inside
# a string, and every byte of the batch is inside one of its strings.
_BLOCK_END = b"\r\n\r\n"
_QUOTE = ord('"')  # ``bytes`` looks for a byte given as an int at once; given as bytes, after a TypeError it clears
_JOINT = b'"},{"'
_JSON = msgspec.json.Decoder(list[dict[str, str]])
_CHUNK = 512


def parse_header_blocks(blocks: Sequence[bytes], skip: int = 0) -> list[dict[str, str]]:
    """``[parse_header_lines(b[skip:]) for b in blocks]``, for a replay's batch in a few passes over all of it,
    each in C: the blocks (``Name: Value`` lines ending in a blank line, as every NATS client writes them) are
    joined into one JSON array of objects by ``bytes.join`` and two ``bytes.replace``, which msgspec reads in one
    call. ``skip``: the bytes before each block's lines (a caller's ``NATS/1.0`` line), cut in the same slice.

    Only where that gives the same as nats-py's reading, else the batch is read block by block: every block ends
    in ``\r\n\r\n``; every byte is printable ASCII or a line end, without a backslash or a quote (nothing for
    JSON to unescape); no ``":  "`` or ``" \r\n"`` (a value with blanks around it, which nats-py strips); each
    line exactly one ``": "`` and no blank line but the last (else the JSON does not parse: a lone CR or LF is a
    control character inside a string); no name with a blank or a colon. Duplicate names keep the first one's
    place and the last value, in a JSON object as in nats-py's loop."""
    if len(blocks) > _CHUNK:  # a chunk's joined text stays in the processor's cache (twice as fast as 4,096)
        return [headers for at in range(0, len(blocks), _CHUNK)
                for headers in parse_header_blocks(blocks[at:at + _CHUNK], skip)]
    if not blocks:
        return []
    count = len(blocks)
    # each block's lines end in a blank line (``skip`` + 4 bytes at least: the cut and the end never overlap)
    if not all(map(bytes.endswith, blocks, repeat(_BLOCK_END, count))) or min(map(len, blocks)) < skip + 4:
        return [parse_header_lines(b[skip:]) for b in blocks]
    parts = [block[skip:-4] for block in blocks]
    if any(map(contains, parts, repeat(_QUOTE, count))):
        return [parse_header_lines(b[skip:]) for b in blocks]
    batch = _JOINT.join(parts)
    if not batch.isascii() or b"\\" in batch or b"\x7f" in batch or \
            b":  " in batch or b" \r\n" in batch or batch.endswith(b" "):
        return [parse_header_lines(b[skip:]) for b in blocks]
    try:
        parsed = _JSON.decode(b'[{"' + batch.replace(b": ", b'":"').replace(b"\r\n", b'","') + b'"}]')
    except msgspec.DecodeError:
        return [parse_header_lines(b[skip:]) for b in blocks]
    if len(parsed) != count or any(" " in name or ":" in name for name in set().union(*parsed)):
        return [parse_header_lines(b[skip:]) for b in blocks]
    return parsed


def original() -> staticmethod:
    """nats-py's own parser (the one ``install`` replaces), for comparison."""
    return _ORIGINAL


def install() -> bool:
    """Use ``parse_header_lines`` in nats-py; False (and nothing changed) when nats-py's parser is not the one
    it was checked against."""
    doc = (getattr(_ORIGINAL, "__func__", _ORIGINAL).__doc__ or "").strip().splitlines()
    if not doc or doc[0].strip() != _REPLACES:
        return False
    Client._parse_header_lines = staticmethod(parse_header_lines)  # type: ignore[method-assign]
    return True
