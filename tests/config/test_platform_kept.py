"""``load_platform_kept``: the platform a service holds is rebuilt in fresh memory after the parse (so the parse's
garbage does not pin the allocator's arenas) and is the very platform ``load_platform`` gives: the same values,
the same keys a person wrote, the same problems refused, and lookups that find the copy's own objects."""

from __future__ import annotations

import pytest

from taugrid.bus.creds import new_identity
from taugrid.config.platform import Platform, load_platform, load_platform_kept
from taugrid.core.errors import ConfigError
from tests.config.test_platform_lookups import TEXT
from tests.platforms import lab_platform, workspace

WITH_PEOPLE = lab_platform(workspaces=[workspace("lab", members=["alice"])], cohort=True,
                           users=[{"name": "alice", "nkey": new_identity("alice").public_key}])


def written(platform: Platform) -> dict[str, object]:
    return platform.model_dump(exclude_unset=True)


@pytest.mark.parametrize("text", [TEXT, WITH_PEOPLE])
def test_the_kept_platform_is_the_parsed_one(text: str) -> None:
    parsed, kept = load_platform(text), load_platform_kept(text)
    parsed._lookups = None  # built while the parse was checked; the kept copy builds its own on first use
    assert kept == parsed
    assert written(kept) == written(parsed)  # what was written, not only what the defaults fill in
    assert kept.model_fields_set == parsed.model_fields_set


def test_lookups_find_the_kept_copys_own_objects() -> None:
    kept = load_platform_kept(TEXT)
    assert kept.cluster_queue("q1") is kept.cluster_queues[0]
    assert kept.workspace("b") is kept.workspaces[1]
    assert kept.cohort_root("leaf") == "top"
    assert [q.name for q in kept.cohort_tree_queues("top")] == ["q1", "q2", "q4"]


def test_an_invalid_platform_is_refused_alike() -> None:
    bad = TEXT.replace("cluster_queue: q1", "cluster_queue: missing")
    with pytest.raises(ConfigError) as parsed:
        load_platform(bad, path="p.yaml")
    with pytest.raises(ConfigError) as kept:
        load_platform_kept(bad, path="p.yaml")
    assert str(kept.value) == str(parsed.value) and kept.value.issues == parsed.value.issues
