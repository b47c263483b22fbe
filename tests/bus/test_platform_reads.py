"""``PlatformReader`` reads the platform's text once per revision (a 1,000-queue platform is 577 KB, read several
times per run), yet every ``get`` is as fresh as a fetch: it asks the bucket's stream whether anything was written
since (``platformstore.mark``), so an apply that has returned is seen by the very next read. Counted on a real
nats-server: the requests for the text (the stream leader's get, as for the mark: never a direct get, which a lagging
replica may answer), by sequence (direct gets) and for the mark (stream info) that the reader sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.subscription import Subscription

from taugrid.bus import Bus, connect, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.creds import new_identity
from taugrid.bus.platformread import PARSED_KEPT, PlatformReader, one_mark, shared_reader
from taugrid.config.platform import Platform
from taugrid.evidence import archive
from taugrid.stack import natsserver
from tests.platforms import lab_platform, workspace

ALICE = new_identity("alice").public_key
BOB = new_identity("bob").public_key
TEXT_GETS = "$JS.API.STREAM.MSG.GET.KV_platform"  # the current text, from the leader: the key's last message
DIRECT_TEXT_GETS = "$JS.API.DIRECT.GET.KV_platform.>"  # the current text by a direct get: never, any replica answers
SEQ_GETS = "$JS.API.DIRECT.GET.KV_platform"  # a revision by sequence
MARKS = "$JS.API.STREAM.INFO.KV_platform"


def people(*names: str) -> str:
    keys = {"alice": ALICE, "bob": BOB}
    return lab_platform(workspaces=[workspace("lab", members=list(names))],
                        users=[{"name": n, "nkey": keys[n]} for n in names])


class Counted:
    """Requests the reader's connection sends, seen by a second connection subscribed to the same subjects:
    ``start`` then ``since_start`` gives how many of each were sent in between."""

    def __init__(self, watcher: Bus, subs: dict[str, Subscription]) -> None:
        self.watcher, self.subs = watcher, subs
        self.before: dict[str, int] = {}

    async def counts(self) -> dict[str, int]:
        await self.watcher.nc.flush()  # the server routed every request before this round trip's answer
        return {name: sub.pending_msgs for name, sub in self.subs.items()}

    async def start(self) -> None:
        self.before = await self.counts()

    async def since_start(self) -> dict[str, int]:
        after = await self.counts()
        return {k: after[k] - self.before[k] for k in after}


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Bus, Counted]]:
    proc, port = natsserver.start(tmp_path / "nats", log_file=tmp_path / "nats.log")
    url = f"nats://127.0.0.1:{port}"
    bus = await connect(url, name="bootstrap")
    watcher = await connect(url, name="watcher")
    try:
        await bootstrap(bus)
        subs = {name: await watcher.nc.subscribe(subject, pending_msgs_limit=100_000)
                for name, subject in (("text", TEXT_GETS), ("direct", DIRECT_TEXT_GETS), ("seq", SEQ_GETS),
                                      ("mark", MARKS))}
        await watcher.nc.flush()
        yield bus, Counted(watcher, subs)
    finally:
        await watcher.close()
        await bus.close()
        proc.kill()  # nothing here outlives the test: no graceful shutdown to wait for
        proc.wait(timeout=10)


async def test_reads_of_an_unchanged_platform_fetch_its_text_once(stack: tuple[Bus, Counted]) -> None:
    bus, counted = stack
    revision = await platformstore.put_text(bus, people("alice", "bob"))
    reader = PlatformReader(bus)
    await counted.start()
    for _ in range(50):
        got = await reader.get()
        assert got is not None and got[1] == revision
    assert await reader.at(revision) is got[0]  # the run's pinned revision, when it is the current one
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 51}


async def test_concurrent_reads_of_a_new_revision_fetch_it_once(stack: tuple[Bus, Counted]) -> None:
    """A service handles many messages at once: all that meet a new revision wait for one fetch of it, and those
    that asked while the first one's mark was in flight share the next mark (two in all, not twenty)."""
    bus, counted = stack
    revision = await platformstore.put_text(bus, people("alice"))
    reader = PlatformReader(bus)
    await counted.start()
    got = await asyncio.gather(*(reader.get() for _ in range(20)))
    assert {g[1] for g in got if g is not None} == {revision} and len({id(g[0]) for g in got if g}) == 1
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 2}


async def test_a_read_that_starts_after_an_apply_sees_it_though_a_mark_was_in_flight(
        stack: tuple[Bus, Counted]) -> None:
    """Shared marks stay as fresh as one's own: a read begun while an earlier read's mark was in flight (asked
    before the apply below returned) waits for a mark asked after it began, and sees the apply."""
    bus, counted = stack
    first = await platformstore.put_text(bus, people("alice", "bob"))
    reader = PlatformReader(bus)
    assert (await reader.get() or (None, 0))[1] == first
    await counted.start()
    earlier = asyncio.ensure_future(reader.get())  # its mark is asked now, before bob's removal
    async with asyncio.timeout(5):  # a mark never asked fails the test, not hangs it
        while (await counted.since_start())["mark"] == 0:  # the server has the request
            await asyncio.sleep(0.001)
    second = await platformstore.put_text(bus, people("alice"))  # bob removed; the apply returned
    later = await reader.get()
    assert later is not None and later[1] == second and later[0].user_by_nkey(BOB) is None
    # asked before the apply, answered before or after the server stored it: either revision is right for it
    assert (await earlier or (None, 0))[1] in (first, second)
    assert (await counted.since_start())["mark"] == 2


async def test_one_mark_serves_the_reads_of_a_handler(stack: tuple[Bus, Counted]) -> None:
    """The evidence's seal reads the platform for the archive a bundle may be in, the run's price and the archive
    to move it to: within ``one_mark`` the three cost one mark; the next seal asks again, and sees an apply made
    in between."""
    bus, counted = stack
    revision = await platformstore.put_text(bus, people("alice"))
    await counted.start()
    with one_mark():
        assert await archive.configured(bus) is None
        pinned = await shared_reader(bus).at(revision)
        assert isinstance(pinned, Platform) and await archive.configured(bus) is None
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 1}
    newer = await platformstore.put_text(bus, people("alice", "bob"))
    with one_mark():
        got = await shared_reader(bus).get()
        assert got is not None and got[1] == newer and await shared_reader(bus).at(revision) is not None
    assert await counted.since_start() == {"text": 2, "direct": 0, "seq": 1, "mark": 2}


async def test_an_apply_is_seen_by_the_next_read(stack: tuple[Bus, Counted]) -> None:
    bus, counted = stack
    first = await platformstore.put_text(bus, people("alice", "bob"))
    reader = PlatformReader(bus)
    got = await reader.get()
    assert got is not None and got[1] == first and got[0].user_by_nkey(BOB) is not None
    second = await platformstore.put_text(bus, people("alice"))  # bob removed
    await counted.start()
    got = await reader.get()
    assert got is not None and got[1] == second
    assert (got[0].user_by_nkey(BOB), got[0].user_by_nkey(ALICE).name) == (None, "alice")  # type: ignore[union-attr]
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 1}


async def test_a_mark_vouched_by_the_stage_before_serves_the_held_text_without_asking(
        stack: tuple[Bus, Counted]) -> None:
    """The submitter asks the mark after a request was stored and hands its token on (``submit.accepted``); the
    policy, holding its text under that same mark, resolves without asking again. A request stored before an
    apply returned keeps the platform its submitter saw (the apply did not bind it); one whose submitter saw the
    apply hands a newer mark, which the policy asks for and fetches, so the apply binds it."""
    bus, counted = stack
    first = await platformstore.put_text(bus, people("alice", "bob"))
    submitter, policy = PlatformReader(bus), PlatformReader(bus)
    assert (await policy.get() or (None, 0))[1] == first  # the policy's text, held under the bucket's mark
    await counted.start()
    got, token = await submitter.get_marked()
    assert got is not None and got[1] == first and token
    assert (await policy.get(vouched=token) or (None, 0))[1] == first
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 1}  # the submitter's alone

    second = await platformstore.put_text(bus, people("alice"))  # bob removed after the request above
    held = await policy.get(vouched=token)  # the request the submitter answered under the older mark
    assert held is not None and held[1] == first and held[0].user_by_nkey(BOB) is not None
    assert (await counted.since_start())["mark"] == 1

    _, newer = await submitter.get_marked()  # the next request, stored after the apply returned
    assert newer and newer != token
    got = await policy.get(vouched=newer)  # not the mark the policy holds: asked, and the new text fetched
    assert got is not None and got[1] == second and got[0].user_by_nkey(BOB) is None
    assert await counted.since_start() == {"text": 3, "direct": 0, "seq": 0, "mark": 3}
    again = await policy.get(vouched=newer)  # held under it now
    assert again is not None and again[1] == second
    assert (await counted.since_start())["mark"] == 3


async def test_a_vouched_mark_from_a_one_mark_read_is_never_handed_on(stack: tuple[Bus, Counted]) -> None:
    """Within ``one_mark`` a read may reuse a mark asked before an apply returned: no token is given for it, so
    nothing downstream takes it as fresh."""
    bus, _ = stack
    await platformstore.put_text(bus, people("alice"))
    reader = PlatformReader(bus)
    with one_mark():
        _, first = await reader.get_marked()
        _, reused = await reader.get_marked()
    assert first and reused == ""


async def test_a_write_to_another_key_costs_one_fetch_and_keeps_the_parse(stack: tuple[Bus, Counted]) -> None:
    bus, counted = stack
    revision = await platformstore.put_text(bus, people("alice"))
    reader = PlatformReader(bus)
    got = await reader.get()
    assert got is not None
    await platformstore.put_local_user(bus, platformstore.LocalUser(name="me", nkey=ALICE))  # moves the mark
    await counted.start()
    again = await reader.get()
    assert again is not None and again[1] == revision and again[0] is got[0]  # the same parse: not parsed again
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 1}


async def test_pinned_revisions_are_fetched_by_sequence_and_parses_are_bounded(stack: tuple[Bus, Counted]) -> None:
    bus, counted = stack
    revisions = [await platformstore.put_text(bus, people("alice") + f"# edit {i}\n") for i in range(PARSED_KEPT + 2)]
    reader = PlatformReader(bus)
    await counted.start()
    pinned = [await reader.at(r) for r in revisions]
    assert all(isinstance(p, Platform) for p in pinned)
    # the current revision once as the current text; every older one by sequence (the bucket may no longer keep it)
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": PARSED_KEPT + 1, "mark": PARSED_KEPT + 2}
    assert len(reader._parsed) == PARSED_KEPT
    assert await reader.at(revisions[-1] + 1000) is None


async def test_the_modules_of_a_process_share_one_reader_per_connection(stack: tuple[Bus, Counted]) -> None:
    """The evidence service finds its archive (``evidence.archive``) and prices a seal (``evidence.store``) from
    the platform: one reader serves both, so each revision is fetched, parsed and held once in the process."""
    bus, counted = stack
    revision = await platformstore.put_text(bus, people("alice"))
    await counted.start()
    assert await archive.configured(bus) is None  # the lab platform names no archive
    pinned = await shared_reader(bus).at(revision)
    assert isinstance(pinned, Platform) and pinned is (await shared_reader(bus).get() or (None,))[0]
    assert shared_reader(bus) is shared_reader(bus) and shared_reader(counted.watcher) is not shared_reader(bus)
    assert await counted.since_start() == {"text": 1, "direct": 0, "seq": 0, "mark": 3}
