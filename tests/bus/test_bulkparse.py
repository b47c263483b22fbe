"""The bulk protocol reader hands over exactly what nats-py's parser would, in the same order, however the
stream is cut into reads: routed messages to their sink (a status alone), everything else to nats-py."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.protocol.parser import Parser

from taugrid.bus import bulkparse

ROUTED = 7


class Recorder:
    """What a connection's parser calls, recorded in order (the parser is the unit here, not the bus)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.stats = {"in_msgs": 0, "in_bytes": 0}
        self._ps: Any = None
        self.detached = False  # the reader was told to hand back (``bulk``'s ``detach_at`` came)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.calls.append(("msg", sid, subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.calls.append(("info", info))

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))

    def sink(self, frames: list[bulkparse.Frame]) -> None:
        if any(not reply for _, reply, _, _ in frames):
            assert len(frames) == 1, "a status comes alone"
        for subject, reply, headers, data in frames:
            self.calls.append(("msg", ROUTED, subject, reply, data, headers))


def frame(sid: int, *, reply: str = "", headers: bytes = b"", data: bytes = b"", tab: bool = False) -> bytes:
    subject = f"run.ws.r{sid}.exec.running"
    sep = "\t" if tab else " "
    args = sep.join(x for x in (subject, str(sid), reply) if x)
    if headers:
        return f"HMSG {args} {len(headers)} {len(headers) + len(data)}\r\n".encode() + headers + data + b"\r\n"
    return f"MSG {args} {len(data)}\r\n".encode() + data + b"\r\n"


HEADERS = b"NATS/1.0\r\nce-id: x\r\nce-type: io.taugrid.run.exec.running.v1\r\n\r\n"
FRAMES = st.one_of(
    st.builds(lambda sid, n, r, h: frame(sid, reply=f"$JS.ACK.RUNS.c.1.{n}.{n}.17000.0" if r else "",
                                         headers=HEADERS if h else b"", data=b"x" * (n * 37 % 3000)),
              st.sampled_from([ROUTED, 9]), st.integers(0, 5000), st.booleans(), st.booleans()),
    st.just(frame(ROUTED, headers=b"NATS/1.0 404 No Messages\r\n\r\n")),  # the server's status, no reply
    st.just(frame(ROUTED, reply="r.1", data=b"big" * 30000)),  # past bulkparse._GATHER: gathered in pieces
    st.just(frame(ROUTED, reply="r.2", tab=True, data=b"{}")),  # tabs between arguments, as nats-py's reading allows
    st.sampled_from([b"PING\r\n", b"PONG\r\n", b"+OK\r\n", b"-ERR 'Stale Connection'\r\n",
                     b'INFO {"server_id":"x","max_payload":1048576}\r\n']),
)


def reference(stream: bytes) -> list[tuple[Any, ...]]:
    nc = Recorder()
    asyncio.run(Parser(nc).parse(stream))
    return [("msg", ROUTED, *call[2:]) if call[0] == "msg" and call[1] == ROUTED else call for call in nc.calls]


def bulk(stream: bytes, cuts: list[int], *, detach_at: int | None = None,
         takeover_at: int = 0) -> tuple[list[tuple[Any, ...]], Recorder]:
    async def feed() -> Recorder:
        nc = Recorder()
        original = Parser(nc)
        await original.parse(stream[:takeover_at])  # nats-py's parser may be mid-frame when the reader takes over
        nc._ps = reader = bulkparse.BulkParser(nc, original)
        reader.sinks[str(ROUTED).encode()] = nc.sink
        inside = (c % (len(stream) + 1) for c in cuts)
        edges = sorted({takeover_at, len(stream), *(c for c in inside if c > takeover_at)})
        for n, (a, b) in enumerate(zip(edges, edges[1:], strict=False)):
            if n == detach_at:
                reader.detach()
                nc.detached = True
            await nc._ps.parse(stream[a:b])
        return nc

    nc = asyncio.run(feed())
    return nc.calls, nc


@settings(max_examples=80, deadline=None)
@given(st.lists(FRAMES, max_size=14).map(b"".join), st.lists(st.integers(0, 1 << 20), max_size=12))
def test_the_same_calls_as_nats_py_however_the_stream_is_cut(stream: bytes, cuts: list[int]) -> None:
    calls, nc = bulk(stream, cuts)
    assert calls == reference(stream)
    assert not nc._ps.rest and not nc._ps.pieces  # every frame read, none left half-way


@settings(max_examples=40, deadline=None)
@given(st.lists(FRAMES, min_size=1, max_size=10).map(b"".join), st.lists(st.integers(0, 1 << 20), max_size=8),
       st.integers(0, 8))
def test_handing_back_to_nats_py_mid_stream_loses_and_repeats_nothing(
        stream: bytes, cuts: list[int], detach_at: int) -> None:
    calls, nc = bulk(stream, cuts, detach_at=detach_at)
    # after the hand-back the routed subscription's messages reach nats-py (``_process_msg``) as any other
    assert [c[:1] + c[2:] for c in calls] == [c[:1] + c[2:] for c in reference(stream)]
    if nc.detached:  # (cuts that coincide make fewer pieces than cuts: the hand-back may never have come)
        assert isinstance(nc._ps, Parser)


@settings(max_examples=40, deadline=None)
@given(st.lists(FRAMES, min_size=1, max_size=10).map(b"".join), st.lists(st.integers(0, 1 << 20), max_size=8),
       st.integers(0, 1 << 20))
def test_taking_over_from_nats_py_mid_frame_loses_and_repeats_nothing(
        stream: bytes, cuts: list[int], takeover: int) -> None:
    takeover %= len(stream) + 1
    calls, _ = bulk(stream, cuts, takeover_at=takeover)
    # until the first frame boundary nats-py's parser reads, the routed messages included (``_process_msg``)
    assert [c[:1] + c[2:] for c in calls] == [c[:1] + c[2:] for c in reference(stream)]


def test_a_message_split_across_reads_at_every_byte() -> None:
    stream = frame(ROUTED, reply="r.1", headers=HEADERS, data=b'{"a":1}') + b"PING\r\n" + frame(9, data=b"z")
    expected = reference(stream)
    for cut in range(len(stream) + 1):
        assert bulk(stream, [cut])[0] == expected, cut


def test_a_run_of_stored_messages_broken_by_others_reaches_its_sink_whole() -> None:
    # the routed run's frames are gathered, handed over at each other frame (another subscription's message, a
    # PING), then gathered again: none may go into a list already handed over
    stored = [frame(ROUTED, reply=f"$JS.ACK.RUNS.c.1.{n}.{n}.17000.0", headers=HEADERS, data=b"{}") for n in range(9)]
    stream = b"".join([*stored[:3], frame(9, data=b"z"), *stored[3:6], b"PING\r\n", *stored[6:]])
    calls, _ = bulk(stream, [])
    assert calls == reference(stream)
    assert [call[3] for call in calls if call[0] == "msg" and call[1] == ROUTED] == \
        [f"$JS.ACK.RUNS.c.1.{n}.{n}.17000.0".encode() for n in range(9)]
