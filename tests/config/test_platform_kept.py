"""``load_platform_kept``: the platform a service holds is rebuilt in fresh memory after the parse (so the parse's
garbage does not pin the allocator's arenas) and is the very platform ``load_platform`` gives: the same values,
the same keys a person wrote, the same problems refused, and lookups that find the copy's own objects."""

from __future__ import annotations

import pytest

from taugrid.bus.creds import new_identity
from taugrid.config.platform import Platform, load_platform, load_platform_kept
from taugrid.config.siteplatform import for_cluster
from taugrid.core.errors import ConfigError
from tests.config.test_platform_clusters import QUOTAS
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


def test_equal_strings_and_fields_sets_are_one_object_in_the_kept_copy() -> None:
    kept = load_platform_kept(TEXT)
    q1, q2 = kept.cluster_queues[0], kept.cluster_queues[1]
    assert q1.preemption.model_fields_set is q2.preemption.model_fields_set
    assert q1.queueing_strategy is q2.queueing_strategy  # two strings in the parse
    flavor = q1.resource_groups[0].flavors[0].name
    assert flavor == q2.resource_groups[0].flavors[0].name and flavor is q2.resource_groups[0].flavors[0].name


def test_a_sites_copy_of_the_kept_platform_leaves_it_as_it_was() -> None:
    """A set of fields is shared among the kept platform's models: the site's deep copy, whose quotas change,
    copies each model's set, so neither the kept platform's values nor what it says was written change."""
    kept = load_platform_kept(QUOTAS)
    before = (kept.model_dump(), written(kept))
    at_a = for_cluster(kept, "onprem-a")
    at_a.cluster_queues[0].resource_groups[0].flavors[0].resources[0].borrowing_limit = "1"
    assert [(q.name, q.nominal("cpu")) for q in at_a.cluster_queues] == [("research", 32.0), ("batch", 8.0)]
    assert (kept.model_dump(), written(kept)) == before
    assert written(load_platform(QUOTAS)) == before[1]


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
