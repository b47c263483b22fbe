"""platform.yaml ``clusters``: the sites runs are dispatched to. Validated with the line and the fix; absent, the
platform is today's single cluster; the order they are tried in is ``preference``, then the file's order."""

from __future__ import annotations

import textwrap

import pytest

from taugrid.config.clusters import in_preference_order, serves
from taugrid.config.platform import load_platform
from taugrid.core.errors import ConfigError

BASE = """\
resource_flavors:
  - name: default
cluster_queues:
  - name: research
    resource_groups:
      - covered_resources: [cpu]
        flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8}]}]
  - name: batch
    resource_groups:
      - covered_resources: [cpu]
        flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8}]}]
"""

THREE = BASE + """\
clusters:
  - name: cloud
    backend: kubernetes
    preference: 10
  - name: onprem-a
    backend: local
    cluster_queues: [research]
  - name: onprem-b
    backend: local
    cluster_queues: [research, batch]
"""


def issues(text: str) -> list[tuple[str, int | None, str, str]]:
    with pytest.raises(ConfigError) as err:
        load_platform(textwrap.dedent(text))
    return [(str(i["field"]), i["line"], str(i["message"]), str(i["fix"])) for i in err.value.issues]  # type: ignore[misc]


def test_no_clusters_is_the_single_cluster_of_before() -> None:
    assert load_platform(BASE).clusters == []


def test_clusters_are_tried_by_preference_then_in_file_order_and_serve_their_queues() -> None:
    p = load_platform(THREE)
    assert [c.name for c in in_preference_order(p.clusters)] == ["onprem-a", "onprem-b", "cloud"]
    by_name = {c.name: c for c in p.clusters}
    assert [n for n, c in by_name.items() if serves(c, "batch")] == ["cloud", "onprem-b"]
    assert [n for n, c in by_name.items() if serves(c, "research")] == ["cloud", "onprem-a", "onprem-b"]
    assert by_name["cloud"].backend == "kubernetes"


def test_an_unknown_queue_is_named_with_the_nearest() -> None:
    assert issues(THREE.replace("cluster_queues: [research]", "cluster_queues: [reserch]")) == [
        ("clusters[1].cluster_queues[0]", 18, "unknown cluster queue 'reserch'; did you mean 'research'?",
         "use one of: research, batch")]


def test_a_queue_no_cluster_serves_is_refused() -> None:
    text = BASE + "clusters:\n  - {name: a, backend: local, cluster_queues: [research]}\n"
    assert issues(text) == [
        ("clusters", 12, "no cluster serves cluster queue 'batch': its runs would never be dispatched",
         "add batch to a cluster's cluster_queues, or leave cluster_queues out on one cluster "
         "(it then serves every queue)")]


def test_duplicate_names_a_bad_name_a_backend_and_an_unknown_key_are_refused() -> None:
    found = issues(BASE + """\
clusters:
  - {name: a, backend: local}
  - {name: a, backend: local}
  - {name: B.x, backend: local}
  - {name: c, backend: slurm}
  - {name: d, backend: local, region: eu}
  - {name: e, backend: local, preference: -1}
""")
    fields = [(f, line) for f, line, _, _ in found]
    assert fields == [("clusters[2].name", 15), ("clusters[3].backend", 16), ("clusters[4].region", 17),
                      ("clusters[5].preference", 18)], found
    messages = {f: m for f, _, m, _ in found}
    assert "pattern" in messages["clusters[2].name"] or "match" in messages["clusters[2].name"], messages
    assert "'local' or 'kubernetes'" in messages["clusters[3].backend"], messages
    # the duplicate is reported by the cross-checks, which run once the shapes are right
    assert issues(BASE + "clusters:\n  - {name: a, backend: local}\n  - {name: a, backend: local}\n") == [
        ("clusters[1].name", 14, "duplicate cluster name 'a'", "give each cluster a distinct name")]


def test_the_apply_diff_names_an_added_and_a_changed_cluster() -> None:
    from taugrid.config.platformdiff import Change, diff

    before = load_platform(THREE)
    after = load_platform(THREE.replace("preference: 10", "preference: 5") + "  - {name: edge, backend: local}\n")
    assert diff(before, after) == [Change("cluster", "edge", "add"),
                                   Change("cluster", "cloud", "change", ("preference: 10 → 5",))]
    incremental = load_platform(THREE + "dispatch: {mode: Incremental}\n")
    assert diff(before, incremental) == [Change("dispatch", "policy", "change", ("mode: AllAtOnce → Incremental",))]


def test_dispatch_keys_act_only_where_they_mean_something() -> None:
    incremental = load_platform(THREE + "dispatch: {mode: Incremental, incremental_step: 2, round_timeout: 90s}\n")
    assert (incremental.dispatch.mode, incremental.dispatch.incremental_step,
            incremental.dispatch.round_timeout) == ("Incremental", 2, 90.0)
    assert load_platform(THREE).dispatch.mode == "AllAtOnce"
    assert issues(THREE + "dispatch: {incremental_step: 2}\n") == [
        ("dispatch.incremental_step", 22, "incremental_step has no effect with mode AllAtOnce (every cluster is "
         "nominated at once)", "set mode: Incremental, or remove incremental_step")]
    assert issues(BASE + "dispatch: {mode: Incremental}\n") == [
        ("dispatch", 12, "dispatch has no effect without clusters",
         "declare clusters: [{name: ..., backend: local}, ...], or remove dispatch")]
    assert issues(BASE + "clusters:\n  - {name: dispatch, backend: local}\n") == [
        ("clusters[0].name", 13, "'dispatch' is reserved: the renderer's requests to the dispatcher travel as "
         "backend.dispatch.*", "choose another name")]


def test_a_platform_dumped_whole_loads_again() -> None:
    """A platform written with every default (tau up's machine platform, a merged apply) is not refused for its
    default dispatch block."""
    import yaml

    for text in (BASE, THREE):
        dumped = yaml.safe_dump(load_platform(text).model_dump(mode="json"))
        assert load_platform(dumped) == load_platform(text)


QUOTAS = """\
resource_flavors:
  - name: default
cluster_queues:
  - name: research
    cohort: all
    resource_groups:
      - covered_resources: [cpu]
        flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8, lending_limit: 4}]}]
  - name: batch
    resource_groups:
      - covered_resources: [cpu]
        flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8}]}]
cohorts: [{name: all}]
clusters:
  - name: onprem-a
    backend: local
    quotas: [{cluster_queue: research, flavor: default, resources: {cpu: 32}}]
  - {name: cloud, backend: local}
"""


def test_a_clusters_own_quota_replaces_the_platforms_at_its_site_only() -> None:
    from taugrid.config.siteplatform import for_cluster

    p = load_platform(QUOTAS)
    at_a = for_cluster(p, "onprem-a")
    assert [(q.name, q.nominal("cpu")) for q in at_a.cluster_queues] == [("research", 32.0), ("batch", 8.0)]
    assert at_a.cluster_queues[0].resource_groups[0].flavors[0].resources[0].lending_limit == "4"
    assert [(q.name, q.nominal("cpu")) for q in p.cluster_queues] == [("research", 8.0), ("batch", 8.0)]
    assert for_cluster(p, "cloud") is p and for_cluster(p, "elsewhere") is p


def test_a_clusters_quota_names_a_served_queue_its_flavor_and_resources() -> None:
    def quota(entry: str, serves: str = "") -> str:
        return QUOTAS.replace("quotas: [{cluster_queue: research, flavor: default, resources: {cpu: 32}}]",
                              f"quotas: [{entry}]" + (f"\n    cluster_queues: [{serves}]" if serves else ""))

    at = "clusters[0].quotas[0]"
    assert issues(quota("{cluster_queue: reserch, flavor: default, resources: {cpu: 32}}")) == [
        (f"{at}.cluster_queue", 17, "unknown cluster queue 'reserch'; did you mean 'research'?",
         "use one of: research, batch")]
    assert issues(quota("{cluster_queue: batch, flavor: default, resources: {cpu: 32}}", serves="research")) == [
        (f"{at}.cluster_queue", 17, "onprem-a does not serve 'batch': its quota there would never hold a run",
         "add batch to its cluster_queues, or remove this quota")]
    assert issues(quota("{cluster_queue: research, flavor: spot, resources: {cpu: 32}}")) == [
        (f"{at}.flavor", 17, "research has no flavor 'spot'", "use one of its flavors: default")]
    assert issues(quota("{cluster_queue: research, flavor: default, resources: {nvidia.com/gpu: 8, cpu: 2}}")) == [
        (f"{at}.resources.cpu", 17, "below research's lending_limit 4 for cpu",
         "give this cluster at least the lending limit, or lower the limit"),
        (f"{at}.resources.nvidia.com/gpu", 17, "research/default has no quota for 'nvidia.com/gpu'",
         "use one of: cpu (a resource the platform's flavor lists)")]
    assert issues(quota("{cluster_queue: research, flavor: default, resources: {cpu: lots}}")) == [
        (f"{at}.resources.cpu", 17, "cpu 'lots' is not a quantity (examples: 2, 500m, 64Gi)",
         "write a quantity such as 16, 500m or 64Gi")]
    assert issues(quota("{cluster_queue: research, flavor: default, resources: {cpu: 8}}, "
                        "{cluster_queue: research, flavor: default, resources: {cpu: 9}}")) == [
        ("clusters[0].quotas[1]", 17, "a second quota for research/default at onprem-a",
         "give each ClusterQueue and flavor one entry, with every resource in it")]
