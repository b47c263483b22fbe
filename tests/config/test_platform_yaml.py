"""platform.yaml: strict models, quantities, cross-references with lines; the sample in deploy/ loads."""

from pathlib import Path

import pytest

from taugrid.config.platform import GPU_RESOURCE, load_platform
from taugrid.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
resource_flavors:
  - name: a100
cohorts:
  - name: research
cluster_queues:
  - name: team-a
    cohort: research
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: a100
            resources:
              - {name: cpu, nominal_quota: 32}
              - {name: memory, nominal_quota: 256Gi}
              - {name: nvidia.com/gpu, nominal_quota: 8, borrowing_limit: 4}
local_queues:
  - {name: q, namespace: team-a, cluster_queue: team-a}
priority_classes:
  - {name: normal, value: 100}
compute_profiles:
  - {name: a100-1, gpu: 1, cpu: 16, memory: 64Gi}
workspaces:
  - name: team-a
    namespace: team-a
    local_queue: q
    default_priority: normal
    default_profile: a100-1
"""


def fields(text: str) -> dict[str, dict]:
    with pytest.raises(ConfigError) as info:
        load_platform(text)
    return {str(i["field"]): i for i in info.value.issues}


def test_a_consistent_platform_loads_with_quantities_parsed_on_use():
    platform = load_platform(GOOD)
    cq = platform.cluster_queue("team-a")
    assert cq.nominal("cpu") == 32 and cq.nominal("memory") == 256 << 30 and cq.nominal(GPU_RESOURCE) == 8
    assert platform.workspace("team-a").output_root == "/data/runs"
    assert platform.priority_class("normal").preemptible is True


def test_the_sample_platform_in_deploy_loads():
    platform = load_platform((ROOT / "deploy" / "platform.yaml").read_text(), path="deploy/platform.yaml")
    assert {w.name for w in platform.workspaces} == {"vision", "language"}
    assert platform.profile("a100-1").gpu == 1 and platform.profile("a100-half").gpu_fraction == 0.5


def test_unknown_key_suggests_the_nearest():
    found = fields(GOOD.replace("    default_profile: a100-1", "    default_profle: a100-1"))
    issue = found["workspaces[0].default_profle"]
    assert "did you mean 'default_profile'?" in issue["message"] and issue["line"] == 28


def test_dangling_references_name_their_field_and_the_known_names():
    text = (
        GOOD.replace("cluster_queue: team-a}", "cluster_queue: team-b}")
        .replace("default_priority: normal", "default_priority: urgent")
        .replace("cohort: research", "cohort: nope")
        .replace("          - name: a100\n", "          - name: h100\n")
        .replace("default_profile: a100-1", "default_profile: a100-2")
    )
    found = fields(text)
    assert "team-a" in found["local_queues[0].cluster_queue"]["fix"]
    assert found["local_queues[0].cluster_queue"]["line"] == 18
    assert "normal" in found["workspaces[0].default_priority"]["fix"]
    assert "cluster_queues[0].cohort" in found
    assert "cluster_queues[0].resource_groups[0].flavors[0].name" in found
    assert "did you mean 'a100-1'?" in found["workspaces[0].default_profile"]["message"]


def test_workspace_queue_must_live_in_the_workspace_namespace():
    found = fields(
        GOOD.replace("    namespace: team-a\n    local_queue: q", "    namespace: team-b\n    local_queue: q")
    )
    assert "team-b" in found["workspaces[0].local_queue"]["message"]


def test_quota_entries_must_match_covered_resources_and_parse():
    found = fields(
        GOOD.replace("{name: memory, nominal_quota: 256Gi}", "{name: memory, nominal_quota: 256Gb}").replace(
            "nominal_quota: 8, borrowing_limit: 4", "nominal_quota: 1.5"
        )
    )
    base = "cluster_queues[0].resource_groups[0].flavors[0].resources"
    assert f"{base}[1].nominal_quota" in found and f"{base}[2].nominal_quota" in found
    found = fields(GOOD.replace("              - {name: cpu, nominal_quota: 32}\n", ""))
    assert "cluster_queues[0].resource_groups[0].flavors[0].resources" in found


def test_enum_values_are_checked():
    found = fields(GOOD.replace("    cohort: research\n", "    queueing_strategy: Fifo\n"))
    assert "StrictFIFO" in found["cluster_queues[0].queueing_strategy"]["fix"]


def test_borrowing_needs_a_cohort():
    found = fields(GOOD.replace("    cohort: research\n", ""))
    assert "cluster_queues[0].resource_groups[0].flavors[0].resources[2].borrowing_limit" in found


def test_duplicate_names_and_cohort_cycles_are_rejected():
    found = fields(
        GOOD.replace(
            "  - name: research\n",
            "  - {name: research, parent: x}\n  - {name: x, parent: research}\n  - name: research\n",
        )
    )
    assert "cohorts[2].name" in found and "cohorts[0].parent" in found


def test_every_unknown_name_is_an_error_with_its_line_and_the_nearest_valid_name():
    text = (
        GOOD.replace("          - name: a100\n", "          - name: a10O\n")
        .replace("    cohort: research\n", "    cohort: reserch\n")
        .replace("cluster_queue: team-a}", "cluster_queue: tema-a}")
        .replace("default_priority: normal", "default_priority: nromal")
        .replace("default_profile: a100-1", "default_profile: a100-l")
    )
    found = fields(text)
    expected = {  # field -> (line in GOOD, nearest valid name)
        "cluster_queues[0].resource_groups[0].flavors[0].name": (12, "a100"),
        "cluster_queues[0].cohort": (8, "research"),
        "local_queues[0].cluster_queue": (18, "team-a"),
        "workspaces[0].default_priority": (27, "normal"),
        "workspaces[0].default_profile": (28, "a100-1"),
    }
    for field, (line, nearest) in expected.items():
        assert found[field]["line"] == line, field
        assert found[field]["message"].endswith(f"; did you mean '{nearest}'?"), found[field]["message"]


def test_a_distant_unknown_name_still_names_the_nearest_valid_one():
    found = fields(GOOD.replace("    cohort: research\n", "    cohort: zzz\n"))
    assert found["cluster_queues[0].cohort"]["message"] == "unknown cohort 'zzz'; did you mean 'research'?"
    assert found["cluster_queues[0].cohort"]["fix"] == "use one of: research"


def test_a_local_queue_in_another_namespace_is_named():
    text = GOOD.replace("  - {name: q, namespace: team-a, cluster_queue: team-a}",
                        "  - {name: q, namespace: team-b, cluster_queue: team-a}")
    issue = fields(text)["workspaces[0].local_queue"]
    assert issue["message"] == "no local queue 'q' in namespace 'team-a' (it exists in namespace 'team-b')"
    assert issue["line"] == 26


def test_the_cli_refuses_an_unknown_name_with_file_line_and_nearest(tmp_path):
    from click.testing import CliRunner

    from taugrid.cli.main import cli

    path = tmp_path / "platform.yaml"
    path.write_text(GOOD.replace("default_priority: normal", "default_priority: nromal"))
    result = CliRunner().invoke(cli, ["platform", "render", str(path)])
    assert result.exit_code == 2
    assert f"{path}:27: workspaces[0].default_priority: unknown priority class 'nromal'; did you mean 'normal'?" \
        in result.output


DEPARTMENTS = """
resource_flavors:
  - name: a100
  - name: h100
departments:
  - name: research
    flavor: a100
    deserved: {nvidia.com/gpu: 8}
    projects:
      - name: vision
        deserved: {nvidia.com/gpu: 2}
        limit: {nvidia.com/gpu: 6}
        over_quota_weight: 3
local_queues:
  - {name: q, namespace: team-vision, cluster_queue: vision}
"""


def test_departments_load_and_their_projects_are_cluster_queues():
    platform = load_platform(DEPARTMENTS)
    vision = platform.cluster_queue("vision")
    assert vision is not None and vision.cohort == "research" and vision.nominal(GPU_RESOURCE) == 2
    assert platform.cohort_root("research") == "departments"


def test_department_names_flavors_and_resources_are_checked_with_lines():
    text = (DEPARTMENTS.replace("    flavor: a100", "    flavor: a10")
            .replace("        deserved: {nvidia.com/gpu: 2}", "        deserved: {gpu: 2}")
            .replace("cluster_queue: vision}", "cluster_queue: visoin}"))
    found = fields(text)
    assert found["departments[0].flavor"]["message"] == "unknown resource flavor 'a10'; did you mean 'a100'?"
    assert found["departments[0].flavor"]["line"] == 7
    gpu = found["departments[0].projects[0].deserved.gpu"]
    assert gpu["message"] == "unknown KAI queue resource 'gpu'; did you mean 'nvidia.com/gpu'?" and gpu["line"] == 11
    assert found["local_queues[0].cluster_queue"]["message"] == "unknown cluster queue 'visoin'; did you mean 'vision'?"


def test_department_limits_and_names_that_clash_are_refused():
    text = (DEPARTMENTS.replace("limit: {nvidia.com/gpu: 6}", "limit: {nvidia.com/gpu: 1}")
            .replace("      - name: vision", "      - name: research"))
    found = fields(text)
    assert found["departments[0].projects[0].limit.nvidia.com/gpu"]["message"] == \
        "limit 1 is below the deserved quota 2"
    assert found["departments[0].projects[0].name"]["message"] == \
        "project 'research' has the name of a department"
    found = fields(DEPARTMENTS.replace("    flavor: a100\n", ""))
    assert found["departments[0].name"]["message"] == \
        "department 'research' names no flavor and the platform declares 2"


def test_a_departments_amd_or_gaudi_quota_is_refused_with_why():
    """KAI's Queue counts nvidia.com/gpu and amd.com/gpu as one gpu, Gaudi's not at all (issue 26)."""
    text = DEPARTMENTS.replace("        deserved: {nvidia.com/gpu: 2}", "        deserved: {amd.com/gpu: 2}")
    amd = fields(text)["departments[0].projects[0].deserved.amd.com/gpu"]
    assert amd["message"] == (
        "KAI queue resource 'amd.com/gpu' is not taken: a KAI Queue has one gpu resource, which KAI fills from "
        "nvidia.com/gpu and amd.com/gpu alike and never from habana.ai/gaudi, while taugrid's local KAI model counts "
        "each by its name")
    assert (amd["fix"], amd["line"]) == ("give departments nvidia.com/gpu quota, or give amd.com/gpu runs a cluster "
                                         "queue of their own (resource_flavors with its gpu_model)", 11)
