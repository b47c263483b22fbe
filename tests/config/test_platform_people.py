"""platform.yaml people: users, groups, workspace members/admins and priority classes, checked with lines."""

import pytest

from taugrid.bus.creds import new_identity
from taugrid.config.platform import load_platform
from taugrid.core.errors import ConfigError

ALICE = new_identity("alice").public_key
BOB = new_identity("bob").public_key
CAROL = new_identity("carol").public_key

BASE = """
local_queues:
  - {name: q, namespace: ns, cluster_queue: cq}
cluster_queues:
  - name: cq
priority_classes:
  - {name: normal, value: 100}
  - {name: critical, value: 1000, preemptible: false}
"""


def platform_text(people: str) -> str:
    return BASE + people


PEOPLE = platform_text(f"""
groups:
  - name: vision-team
users:
  - {{name: alice, nkey: {ALICE}, groups: [vision-team]}}
  - {{name: bob, nkey: {BOB}}}
  - {{name: carol, nkey: {CAROL}, role: platform-admin}}
workspaces:
  - name: vision
    namespace: ns
    local_queue: q
    members: [vision-team]
    admins: [bob]
    allowed_priority_classes: [normal]
  - name: language
    namespace: ns
    local_queue: q
""")


def issues(text: str) -> dict[str, dict]:
    with pytest.raises(ConfigError) as info:
        load_platform(text)
    return {str(i["field"]): i for i in info.value.issues}


def test_membership_expands_groups_admins_and_platform_admins():
    platform = load_platform(PEOPLE)
    assert platform.workspace_members("vision") == {"alice", "bob", "carol"}
    assert platform.workspace_admins("vision") == {"bob", "carol"}
    assert platform.workspace_members("language") == {"carol"}
    assert platform.workspaces_of("alice") == ["vision"]
    assert platform.workspaces_of("carol") == ["vision", "language"]
    assert platform.user_by_nkey(ALICE).name == "alice"
    assert platform.allows_priority("vision", "normal") and not platform.allows_priority("vision", "critical")
    assert platform.allows_priority("language", "critical")
    assert not platform.single_user


def test_a_platform_without_users_is_single_user_mode():
    platform = load_platform(BASE + "workspaces:\n  - {name: w, namespace: ns, local_queue: q}\n")
    assert platform.single_user and platform.users == [] and platform.workspace("w").members == []


def test_dangling_people_references_name_field_line_and_fix():
    text = platform_text(f"""
groups:
  - name: vision-team
users:
  - {{name: alice, nkey: {ALICE}, groups: [vison-team]}}
  - {{name: bob, nkey: UNOTAKEY}}
  - {{name: dave, nkey: {ALICE}}}
workspaces:
  - name: vision
    namespace: ns
    local_queue: q
    members: [alcie]
    default_priority: critical
    allowed_priority_classes: [normal, urgent]
""")
    found = issues(text)
    assert "did you mean 'vision-team'" in found["users[0].groups[0]"]["message"]
    assert found["users[0].groups[0]"]["line"] == 13
    assert "not a public user nkey" in found["users[1].nkey"]["message"]
    assert "tau admin user add" in found["users[1].nkey"]["fix"]
    assert found["users[2].nkey"]["message"] == "the same key as user 'alice'"
    assert "did you mean 'alice'" in found["workspaces[0].members[0]"]["message"]
    assert found["workspaces[0].allowed_priority_classes[1]"]["fix"] == "use one of: critical, normal"
    assert "not in allowed_priority_classes" in found["workspaces[0].default_priority"]["message"]


def test_members_without_users_and_bad_roles_are_refused():
    found = issues(BASE + "workspaces:\n  - {name: w, namespace: ns, local_queue: q, members: [alice]}\n")
    assert "platform has no users" in found["workspaces[0].members[0]"]["message"]
    found = issues(BASE + f"users:\n  - {{name: alice, nkey: {ALICE}, role: root}}\n")
    assert "users[0].role" in found
    found = issues(BASE + f"users:\n  - {{name: Alice Smith, nkey: {ALICE}}}\n")
    assert "users[0].name" in found
