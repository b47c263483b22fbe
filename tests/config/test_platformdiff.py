"""What a platform file changes against the stored revision, and which people it keeps (config/platformdiff)."""

from __future__ import annotations

import yaml

from taugrid.bus import identity
from taugrid.config.platform import Platform, load_platform
from taugrid.config.platformdiff import Change, diff, inert_here, merge_people, retention_note

ALICE, BOB = (identity.public_key(identity.new_user_seed()) for _ in range(2))
BASE = """
resource_flavors: [{name: default}]
cluster_queues:
  - name: cq
    resource_groups:
      - covered_resources: [cpu, nvidia.com/gpu]
        flavors: [{name: default, resources: [{name: cpu, nominal_quota: 8}, {name: nvidia.com/gpu, nominal_quota: 4}]}]
local_queues: [{name: q, namespace: ns, cluster_queue: cq}]
workspaces:
  - {name: vision, namespace: ns, local_queue: q, members: MEMBERS}
  - {name: language, namespace: ns, local_queue: q}
"""


def platform(members: str = "[]", people: str = "") -> Platform:
    return load_platform(BASE.replace("MEMBERS", members) + people)


STORED = platform("[alice, ml]", f"users: [{{name: alice, nkey: {ALICE}, groups: [ml]}}]\ngroups: [{{name: ml}}]\n")


def test_a_file_that_does_not_list_a_user_keeps_them_their_groups_and_memberships() -> None:
    merged = merge_people(STORED, platform(), file_name="platform.yaml")
    assert merged.platform.users == STORED.users and merged.platform.groups == STORED.groups
    assert merged.platform.workspace("vision").members == ["alice", "ml"]  # type: ignore[union-attr]
    assert [c.lines() for c in merged.kept] == [
        ["= user alice: not in platform.yaml; kept with their memberships (`tau admin user remove alice` or "
         "--prune removes them)"],
        ["= group ml: not in platform.yaml; kept (--prune removes it)"],
        ["= workspace vision: members alice, ml kept, not in platform.yaml"],
    ]
    assert diff(STORED, merged.platform) == []


def test_a_file_that_lists_everyone_is_taken_as_it_is() -> None:
    file = STORED.model_copy()
    merged = merge_people(STORED, file)
    assert merged.platform is file and merged.kept == ()


def test_the_files_own_entry_for_a_person_wins_and_a_key_given_to_another_name_is_a_rename() -> None:
    changed = platform("[alice]", f"users: [{{name: alice, nkey: {BOB}, role: platform-admin}}]\n")
    merged = merge_people(STORED, changed)
    assert [(u.name, u.nkey, u.role) for u in merged.platform.users] == [("alice", BOB, "platform-admin")]
    renamed = merge_people(STORED, platform("[ally]", f"users: [{{name: ally, nkey: {ALICE}}}]\n"))
    assert [u.name for u in renamed.platform.users] == ["ally"]
    assert renamed.platform.workspace("vision").members == ["ally", "ml"]  # type: ignore[union-attr]


def test_the_diff_names_quotas_by_flavor_and_resource_and_members_by_name() -> None:
    new = load_platform(BASE.replace("MEMBERS", "[bob]").replace("nominal_quota: 4", "nominal_quota: 8")
                        .replace("  - {name: language, namespace: ns, local_queue: q}\n",
                                 "  - {name: audio, namespace: ns, local_queue: q, max_retries: 2}\n")
                        + f"users: [{{name: bob, nkey: {BOB}}}]\n")
    assert diff(STORED, new) == [
        Change("workspace", "audio", "add"),
        Change("workspace", "language", "remove"),
        Change("workspace", "vision", "change", ("members: +bob -alice -ml",)),
        Change("user", "bob", "add"),
        Change("user", "alice", "remove"),
        Change("group", "ml", "remove"),
        Change("cluster_queue", "cq", "change", ("quota[default/nvidia.com/gpu].nominal_quota: 4 → 8",)),
    ]
    assert Change("cluster_queue", "cq", "change", ("a: 1 → 2",)).lines() == ["~ cluster_queue cq", "    a: 1 → 2"]


def test_a_merged_platform_written_as_yaml_reads_back_the_same() -> None:
    merged = merge_people(STORED, platform()).platform
    text = yaml.safe_dump(merged.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
    assert load_platform(text) == merged


def test_the_diff_names_each_wait_for_pods_ready_field_that_changes() -> None:
    new = platform(people="wait_for_pods_ready: {timeout: 5m, requeuing_strategy: {backoff_limit_count: 3}}\n")
    [change] = diff(platform(), new)
    assert change.lines() == ["~ wait_for_pods_ready policy", "    timeout: 1800.0 → 300.0",
                              "    requeuing_strategy.backoff_limit_count: unset → 3"]


def test_the_diff_names_each_retention_field_and_says_what_applying_it_leaves_to_do() -> None:
    new = platform(people="retention: {runs: {max_age: 7d}, evidence: {archive: {directory: "
                   "/var/lib/taugrid/archive}}}\n")
    [change] = diff(platform(), new)
    assert change.lines() == ["~ retention policy", "    runs.max_age: 2592000.0 → 604800.0",
                              "    evidence.archive: unset → {'directory': '/var/lib/taugrid/archive', 's3': None}"]
    assert retention_note([change]) == (
        "existing streams keep their limits until `python -m taugrid.bus.bootstrap --update` (the break-glass "
        "identity) applies retention.runs/logs/audit; the evidence archive applies from the next seal; runs sealed "
        "before stay where they are")
    assert retention_note(diff(platform(), platform())) == ""


def test_what_a_backend_does_not_act_on_is_said_not_silently_stored() -> None:
    assert inert_here(platform(), "local") == inert_here(platform(), "kubernetes") == []
    sites = platform(people="clusters: [{name: onprem, backend: local}]\n")
    (local,) = inert_here(sites, "local")
    assert local.startswith("clusters/dispatch act from the next start of a local stack (`tau down`, `tau up`)")
    (kube,) = inert_here(sites, "kubernetes")
    assert kube.startswith("clusters/dispatch act on Kubernetes once the release's platform.config names them")
    for note in (local, kube):
        assert "this stack's own backend" in note
    recovery = platform(people="wait_for_pods_ready: {recovery_timeout: 2m}\n")
    (note,) = inert_here(recovery, "local")
    assert note.startswith("wait_for_pods_ready.recovery_timeout has nothing to time on the local cluster")
    assert inert_here(recovery, "kubernetes") == []
