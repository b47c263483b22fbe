"""A platform's name lookups are built once per platform object (issue 30: 1,000 queues walked per run), and give
exactly what walking the lists gives, on the object they were built for and on copies with other lists."""

from __future__ import annotations

from taugrid.config.platform import Platform, Workspace, load_platform

TEXT = """\
resource_flavors:
  - name: cpu
cohorts:
  - {name: top}
  - {name: mid, parent: top}
  - {name: leaf, parent: mid}
  - {name: solo}
cluster_queues:
  - name: q1
    cohort: mid
    resource_groups: [{covered_resources: [cpu], flavors: [{name: cpu, resources: [{name: cpu, nominal_quota: 2}]}]}]
  - name: q2
    cohort: top
    resource_groups: [{covered_resources: [cpu], flavors: [{name: cpu, resources: [{name: cpu, nominal_quota: 3}]}]}]
  - name: q3
    resource_groups: [{covered_resources: [cpu], flavors: [{name: cpu, resources: [{name: cpu, nominal_quota: 5}]}]}]
  - name: q4
    cohort: leaf
    resource_groups: [{covered_resources: [cpu], flavors: [{name: cpu, resources: [{name: cpu, nominal_quota: 7}]}]}]
local_queues:
  - {name: lq, namespace: default, cluster_queue: q1}
workspaces:
  - {name: a, namespace: default, local_queue: lq}
  - {name: b, namespace: default, local_queue: lq}
"""


def walked_root(platform: Platform, cohort: str | None) -> str | None:
    parents = {c.name: c.parent for c in platform.all_cohorts()}
    seen: set[str] = set()
    while cohort is not None and parents.get(cohort) and cohort not in seen:
        seen.add(cohort)
        cohort = parents[cohort]
    return cohort


def test_lookups_give_what_a_walk_gives() -> None:
    platform = load_platform(TEXT)
    for name in ("q1", "q2", "q3", "q4", "nope"):
        assert platform.cluster_queue(name) is next((q for q in platform.cluster_queues if q.name == name), None)
    assert platform.workspace("a") is platform.workspaces[0] and platform.workspace("zz") is None
    for cohort in (None, "top", "mid", "leaf", "solo", "unknown"):
        assert platform.cohort_root(cohort) == walked_root(platform, cohort)
        assert platform.cohort_root(cohort) == walked_root(platform, cohort)  # the memo, asked again
    assert platform.cohort_root("mid") == "top" and platform.cohort_root("leaf") == "top"
    assert [q.name for q in platform.cohort_tree_queues("top")] == ["q1", "q2", "q4"]
    assert platform.cohort_tree_nominal("top", "cpu") == 12.0
    assert platform.cohort_tree_queues("solo") == []
    assert platform.cohort_tree_queues("nobody") == [] and platform.cohort_tree_nominal("nobody", "cpu") == 0


def test_a_copy_with_other_lists_looks_up_its_own() -> None:
    platform = load_platform(TEXT)
    assert platform.workspace("c") is None  # the lookups are built on this object now
    extra = Workspace(name="c", namespace="default", local_queue="lq")
    copied = platform.model_copy(update={"workspaces": [*platform.workspaces, extra]})
    assert copied.workspace("c") is extra
    assert platform.workspace("c") is None
    deep = platform.model_copy(deep=True)
    assert deep.cluster_queue("q1") is deep.cluster_queues[0]
    assert deep.cluster_queue("q1") is not platform.cluster_queues[0]


def test_the_first_of_a_duplicated_name_is_found_as_a_walk_finds_it() -> None:
    platform = load_platform(TEXT)
    twin = Workspace(name="a", namespace="other", local_queue="lq")
    copied = platform.model_copy(update={"workspaces": [*platform.workspaces, twin]})
    assert copied.workspace("a") is platform.workspaces[0]
