"""The portal's runs list comes in pages (``GET /api/runs?limit=&cursor=``), over a real nats-server of its own
(so the run records listed are exactly the ones written here) and the portal's real aiohttp app."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nkeys
import pytest
from aiohttp.test_utils import TestClient, TestServer

from taugrid import runrecord
from taugrid.access import delegation
from taugrid.bus import Bus, connect, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.identity import new_user_seed
from taugrid.core import paging
from taugrid.core.states import RunRecord
from taugrid_services.portal.app import build

RUNS = 7  # created 1000.0 … 1006.0; two more share created 1003.0 to test the tie-break on run_id


@pytest.fixture
async def portal(fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> AsyncIterator[tuple[TestClient[Any, Any],
                                                                                               dict[str, str]]]:
    _, port, _ = fresh_nats
    bus: Bus = await connect(f"nats://127.0.0.1:{port}", name="test-portal")
    try:
        await bootstrap(bus)
        person = new_user_seed()
        await platformstore.put_local_user(bus, platformstore.LocalUser(
            name="owner", nkey=nkeys.from_seed(person).public_key.decode()))
        portal_key = nkeys.from_seed(new_user_seed()).public_key.decode()
        for i in range(RUNS):
            assert await runrecord.create(bus, RunRecord(run_id=f"r{i}", workspace="default", state="succeeded",
                                                        created=1000.0 + i))
        for run_id in ("r3a", "r3b"):
            assert await runrecord.create(bus, RunRecord(run_id=run_id, workspace="other", state="failed",
                                                        created=1003.0))
        token = delegation.issue(person, delegate=portal_key, ttl_s=600)
        async with TestClient(TestServer(build(bus, portal_key=portal_key))) as client:
            yield client, {"Authorization": f"Bearer {token}"}
    finally:
        await bus.close()


async def _get(client: TestClient[Any, Any], auth: dict[str, str], query: str) -> tuple[int, Any]:
    response = await client.get(f"/api/runs{query}", headers=auth)
    return response.status, await response.json()


async def test_pages_follow_each_other_newest_first_until_the_last(portal: tuple[TestClient[Any, Any],
                                                                                 dict[str, str]]) -> None:
    client, auth = portal
    seen: list[str] = []
    query, pages = "?limit=4", 0
    while True:
        status, body = await _get(client, auth, query)
        assert status == 200 and body["limit"] == 4
        seen += [r["run_id"] for r in body["runs"]]
        pages += 1
        if body["next"] is None:
            break
        query = f"?limit=4&cursor={body['next']}"
    assert pages == 3
    assert seen == ["r6", "r5", "r4", "r3b", "r3a", "r3", "r2", "r1", "r0"]  # ties broken by run id, none lost

    status, body = await _get(client, auth, "")
    assert (status, body["limit"], body["next"], len(body["runs"])) == (200, paging.DEFAULT_LIMIT, None, RUNS + 2)
    status, body = await _get(client, auth, "?workspace=other&limit=1")
    assert [r["run_id"] for r in body["runs"]] == ["r3b"]
    status, body = await _get(client, auth, f"?workspace=other&limit=1&cursor={body['next']}")
    assert ([r["run_id"] for r in body["runs"]], body["next"]) == (["r3a"], None)  # filters apply to every page


async def test_a_new_run_does_not_shift_a_later_page(portal: tuple[TestClient[Any, Any], dict[str, str]],
                                                     fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    client, auth = portal
    _, first = await _get(client, auth, "?limit=3")
    assert [r["run_id"] for r in first["runs"]] == ["r6", "r5", "r4"]
    bus = await connect(f"nats://127.0.0.1:{fresh_nats[1]}", name="test-late-run")
    try:
        assert await runrecord.create(bus, RunRecord(run_id="r9", workspace="default", state="queued",
                                                    created=2000.0))
    finally:
        await bus.close()
    _, second = await _get(client, auth, f"?limit=3&cursor={first['next']}")
    assert [r["run_id"] for r in second["runs"]] == ["r3b", "r3a", "r3"]


@pytest.mark.parametrize(("query", "message"), [
    ("?limit=0", f"limit must be from 1 to {paging.MAX_LIMIT}, not 0: ask for the next page with its cursor "
                 "instead of a larger page"),
    (f"?limit={paging.MAX_LIMIT + 1}", f"limit must be from 1 to {paging.MAX_LIMIT}, not {paging.MAX_LIMIT + 1}: "
                                       "ask for the next page with its cursor instead of a larger page"),
    ("?limit=ten", f"limit must be a whole number from 1 to {paging.MAX_LIMIT}, not 'ten'"),
    ("?cursor=bm90LWpzb24", "cursor 'bm90LWpzb24' is not a cursor of a runs list: pass the `next` value of the "
                            "previous page unchanged"),
    ("?cursor=WzEsMiwzXQ", "cursor 'WzEsMiwzXQ' is not a cursor of a runs list: pass the `next` value of the "
                           "previous page unchanged"),  # valid JSON, [1,2,3], but not [created, run_id]
    ("?page=2", "unknown parameter 'page'; filters are state, workspace, user, q and paging limit, cursor"),
])
async def test_bad_paging_is_refused_naming_the_parameter(portal: tuple[TestClient[Any, Any], dict[str, str]],
                                                          query: str, message: str) -> None:
    client, auth = portal
    assert await _get(client, auth, query) == (400, {"error": message, "fix": ""})


def test_a_cursor_round_trips_and_pages_without_a_limit_return_everything() -> None:
    records = [RunRecord(run_id=f"x{i}", workspace="w", created=float(i)) for i in range(3)]
    assert paging.decode_cursor(paging.encode_cursor(records[1])) == (1.0, "x1")
    assert paging.page(records, limit=None) == (records[::-1], "")
    shown, nxt = paging.page(records, limit=2)
    assert (shown, paging.page(records, limit=2, after=nxt)) == (records[:0:-1], ([records[0]], ""))
