"""The faster header parser returns exactly what nats-py's own returns, for any bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from taugrid.bus import natsheaders

ORIGINAL = natsheaders.original().__func__

LINE_PARTS = st.sampled_from([b"ce-id", b"Nats-Msg-Id", b" ce-type ", b"na me", b"x\x1cy", b"\xff\xfe", b":", b": ",
                              b"\t", b" ", b"\r\n", b"\r", b"\n", b"value", b"caf\xc3\xa9", b"\xc3", b"\x0b", b""])


@settings(max_examples=400, deadline=None)
@given(st.lists(LINE_PARTS, max_size=24).map(b"".join))
def test_same_headers_as_nats_py_on_header_like_bytes(raw: bytes) -> None:
    assert natsheaders.parse_header_lines(raw) == ORIGINAL(raw)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_same_headers_as_nats_py_on_arbitrary_bytes(raw: bytes) -> None:
    assert natsheaders.parse_header_lines(raw) == ORIGINAL(raw)


def test_a_cloudevent_header_block() -> None:
    raw = (b"ce-specversion: 1.0\r\nce-id: run-1.1.submit.accepted\r\nce-type: io.taugrid.run.submit.accepted\r\n"
           b"Nats-Msg-Id: run-1.1.submit.accepted\r\nce-tauuser:  caf\xc3\xa9 \r\nbad name: x\r\n\r\n")
    assert natsheaders.parse_header_lines(raw) == ORIGINAL(raw) == {
        "ce-specversion": "1.0", "ce-id": "run-1.1.submit.accepted", "ce-type": "io.taugrid.run.submit.accepted",
        "Nats-Msg-Id": "run-1.1.submit.accepted", "ce-tauuser": "café"}


def test_installed_once_the_bus_adapter_is_imported() -> None:
    from nats.aio.client import Client

    import taugrid.bus.connection  # noqa: F401 - importing it installs the parser

    assert Client._parse_header_lines is natsheaders.parse_header_lines


NAMES = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=":"),
                min_size=1, max_size=12)
VALUES = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(NAMES, VALUES), max_size=14), st.sampled_from([b"", b"\r\n", b"\r\n\r\n"]))
def test_same_headers_as_nats_py_on_blocks_as_clients_write_them(pairs: list[tuple[str, str]], tail: bytes) -> None:
    raw = b"".join(f"{name}: {value}\r\n".encode() for name, value in pairs) + tail
    assert natsheaders.parse_header_lines(raw) == ORIGINAL(raw)


BLOCKS = st.lists(LINE_PARTS, max_size=12).map(b"".join)
PLAIN_BLOCKS = st.tuples(st.lists(st.tuples(NAMES, VALUES), max_size=8),
                         st.sampled_from([b"\r\n", b"\r\n\r\n", b"\r\n\r\n\r\n"])).map(
    lambda pt: b"".join(f"{name}: {value}\r\n".encode() for name, value in pt[0]) + pt[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(BLOCKS, PLAIN_BLOCKS), max_size=6))
def test_a_batch_of_blocks_reads_as_nats_py_reads_each(blocks: list[bytes]) -> None:
    assert natsheaders.parse_header_blocks(blocks) == [ORIGINAL(b) for b in blocks]


@settings(max_examples=200, deadline=None)
@given(st.lists(PLAIN_BLOCKS, min_size=1, max_size=6))
def test_a_batch_of_blocks_as_clients_write_them_reads_as_nats_py_reads_each(blocks: list[bytes]) -> None:
    got = natsheaders.parse_header_blocks(blocks)
    assert got == [ORIGINAL(b) for b in blocks]
    assert [list(h) for h in got] == [list(ORIGINAL(b)) for b in blocks]  # the names in the same order too


def test_a_batch_with_odd_values_reads_as_nats_py_reads_each() -> None:
    plain = b"ce-id: a\r\nce-type: io.taugrid.run.exec.running.v1\r\nce-id: b\r\nempty: \r\n: nameless\r\n\r\n"
    odd = [b'quote: say "hi"\r\n\r\n', b"back: a\\b\r\n\r\n", b"sep: a: b\r\n\r\n", b"lead:  x\r\n\r\n",
           b"trail: x \r\n\r\n", b"tab:\tx\r\n\r\n", b"na me: x\r\n\r\n", b"a:b: c\r\n\r\n", b"nocolon\r\n\r\n",
           b"mid: 1\r\n\r\nafter: 2\r\n\r\n", b"utf: caf\xc3\xa9\r\n\r\n", b"bad: \xff\r\n\r\n", b"lone: a\rb\r\n\r\n",
           b"end: no blank line\r\n", b"x: 1\r\n\r\n\r\n",
           # control characters and DEL, which the batch leaves to the JSON reader (or refuses) rather than a scan
           b"del: a\x7fb\r\n\r\n", b"ctl: a\x01b\r\n\r\n", b"lf: a\nb\r\n\r\n", b"x\x1cy: 1\r\n\r\n",
           b"ff: a\x0c\r\n\r\n", b"nul\x00: 1\r\n\r\n", b"high: \x80\r\n\r\n"]
    assert natsheaders.parse_header_blocks([plain, plain]) == [ORIGINAL(plain)] * 2
    assert list(natsheaders.parse_header_blocks([plain])[0]) == ["ce-id", "ce-type", "empty", ""]
    for block in odd:
        assert natsheaders.parse_header_blocks([plain, block, plain]) == [ORIGINAL(plain), ORIGINAL(block),
                                                                          ORIGINAL(plain)], block


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(BLOCKS, PLAIN_BLOCKS), max_size=6), st.sampled_from([b"", b"NATS/1.0\r\n", b"\r\n"]))
def test_a_batch_read_past_a_prefix_reads_as_nats_py_reads_each_without_it(blocks: list[bytes], prefix: bytes) -> None:
    with_prefix = [prefix + b for b in blocks]
    assert natsheaders.parse_header_blocks(with_prefix, len(prefix)) == [ORIGINAL(b) for b in blocks]


def test_a_prefix_overlapping_the_blank_line_is_not_read_as_an_empty_block() -> None:
    # b"NATS/1.0\r\n\r\n": the cut (10 bytes) and the block end (4) overlap; its lines are b"\r\n", not b""
    blocks = [b"NATS/1.0\r\nce-id: a\r\n\r\n", b"NATS/1.0\r\n\r\n", b"NATS/1.0\r\n\r\n\r\n"]
    assert natsheaders.parse_header_blocks(blocks, 10) == [{"ce-id": "a"}, {}, {}]
    assert natsheaders.parse_header_blocks(blocks[:1] * 2, 10) == [{"ce-id": "a"}] * 2
