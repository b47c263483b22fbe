"""tau.yaml: strict parsing, line-aware errors, aliases, schema and hash."""

import json

import pytest

from taugrid.config.taujob import config_hash, load_tau_config, tau_json_schema
from taugrid.core.contracts import Issue
from taugrid.core.errors import ConfigError

MINIMAL = "name: train\nentrypoint: train.py\n"


def errors(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_tau_config(text)
    return info.value


def by_field(err: ConfigError) -> dict[str, dict]:
    return {str(i["field"]): i for i in err.issues}


def test_unknown_key_names_line_and_nearest_key():
    err = errors("name: train\nentrypoint: train.py\ncompute:\n  cpu_request: 2\n  gpuz: 1\n")
    issue = by_field(err)["compute.gpuz"]
    assert issue["line"] == 5 and issue["file"] == "tau.yaml"
    assert "did you mean 'gpus'?" in issue["message"]
    assert str(err).startswith("tau.yaml:5: compute.gpuz: unknown key; did you mean 'gpus'?")
    Issue(**issue)  # issues have exactly the wire shape


def test_unknown_top_level_key_without_close_match_lists_valid_keys():
    issue = by_field(errors(MINIMAL + "scheduling: {x: 1}\n"))["scheduling"]
    assert issue["line"] == 3 and "compute" in issue["fix"]


def test_type_error_names_the_field_and_value():
    err = errors(MINIMAL + "compute:\n  gpus: two\n")
    issue = by_field(err)["compute.gpus"]
    assert issue["line"] == 4 and "'two'" in issue["message"] and issue["fix"] == "use a whole number"


def test_reports_every_type_error_at_once():
    err = errors(MINIMAL + "compute: {gpus: -1, cpu_request: 4x}\nexecution: {launcher: deepspeed}\n")
    assert {"compute.gpus", "compute.cpu_request", "execution.launcher"} <= set(by_field(err))
    assert "torchrun" in by_field(err)["execution.launcher"]["fix"]


@pytest.mark.parametrize("text", ["name: [unclosed\n", "- just\n- a list\n", "", "42\n"])
def test_non_yaml_or_non_mapping_is_a_clear_error(text):
    err = errors(text)
    assert err.issues and ("YAML" in str(err) or "mapping" in str(err))


def test_duplicate_keys_are_errors():
    issue = by_field(errors(MINIMAL + "name: other\n"))["name"]
    assert issue["line"] == 3 and "duplicate" in issue["message"]


def test_managed_manifest_is_projected_and_a_direct_one_with_schema_version_stays_strict():
    cfg = load_tau_config("schema_version: 1\nname: x\nrun: {entrypoint: a.py}\n")
    assert (cfg.managed, cfg.engine, cfg.entrypoint, cfg.warnings) == (True, "job", "a.py", [])
    err = errors("schema_version: 1\nname: x\nrun: {engine: job, entrypoint: a.py}\nscheduling: {a: b}\n")
    assert [i["field"] for i in err.issues] == ["scheduling"]


def test_engine_is_inferred_and_rayjob_is_an_alias():
    assert load_tau_config(MINIMAL).engine == "job"
    assert load_tau_config(MINIMAL + "compute: {workers: 2}\n").engine == "ray"
    assert load_tau_config(MINIMAL + "runtime: {pip: [torch]}\n").engine == "ray"
    assert load_tau_config(MINIMAL + "engine: rayjob\n").engine == "ray"


def test_aliases_fold_into_canonical_places():
    cfg = load_tau_config("run: {name: train, script: train.py, image: img:1}\nimage: low:1\n")
    assert (cfg.name, cfg.entrypoint, cfg.runtime.image) == ("train", "train.py", "img:1")
    assert load_tau_config("name: a\nscript: b.py\nimage: i:1\n").runtime.image == "i:1"


def test_durations_and_args_are_normalised():
    cfg = load_tau_config(
        MINIMAL + "args: [--epochs, 3, --fast, true]\nrun: {active_deadline: 2h}\n"
        "resilience: {backoff_initial: 10s, backoff_max: 1h, max_retries: 2}\n"
    )
    assert cfg.args == ["--epochs", "3", "--fast", "true"]
    assert cfg.run.active_deadline == 7200
    assert (cfg.resilience.backoff_initial, cfg.resilience.backoff_max) == (10, 3600)
    assert cfg.resilience.retry_on == ["Preempted", "Evicted"]


def test_bad_duration_is_reported_on_its_field():
    issue = by_field(errors(MINIMAL + "resilience:\n  backoff_max: 5 minutes\n"))["resilience.backoff_max"]
    assert issue["line"] == 4 and "not a duration" in issue["message"]


def test_json_schema_forbids_extra_keys_everywhere():
    schema = tau_json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["additionalProperties"] is False
    assert all(
        d.get("additionalProperties") is False for d in schema["$defs"].values() if d.get("type") == "object"
    )
    assert "gpu_fraction" in schema["$defs"]["Compute"]["properties"]
    json.dumps(schema)


def test_config_hash_is_stable_and_sensitive():
    a, b = load_tau_config(MINIMAL), load_tau_config("entrypoint: train.py\nname: train\n")
    assert config_hash(a) == config_hash(b) and len(config_hash(a)) == 64
    assert config_hash(a) != config_hash(load_tau_config(MINIMAL + "args: [--x]\n"))


def test_example_b_from_the_reference_loads():
    text = """
name: train
engine: rayjob
entrypoint: train.py
run: {working_dir: ., working_dir_excludes: [".venv", "data"]}
runtime:
  image: mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0
  pip: ["torch>=2.4.0"]
  env: {LOG_LEVEL: info}
  env_secret: {HF_TOKEN: "hf-credentials:token"}
compute:
  workers: 1
  gpus_per_worker: 1
  worker_cpu_request: "16"
  worker_memory_request: 64Gi
policy: {profile: training-1gpu, gpu_class: a100-80gb, priority_tier: default}
storage: {data_pvc: training-data, output: /data/projects/ws/runs/train, checkpoint: last.safetensors}
experiment: {project: research, name: lr-sweep, group: baseline}
metrics: {history: ["metrics/*.jsonl"], offload: {enabled: true}}
resilience: {max_retries: 2, retry_on: [Preempted, Evicted], backoff_initial: 30s, backoff_max: 5m}
"""
    cfg = load_tau_config(text)
    assert cfg.engine == "ray" and cfg.compute.worker_memory_request == "64Gi"


@pytest.mark.parametrize(("text", "line", "message", "fix"), [
    ("name: t\nentrypoint train.py\ncompute: {gpus: 1}\n", 2, "a key without ':'", "write 'key: value' on line 2"),
    ("name: t\ncompute: {gpus: 1\nentrypoint: t.py\n", 2, "(a '}' is missing)", "close the '{' opened on line 2"),
    ("name: 't\nentrypoint: t.py\n", 1, "a quote is never closed", "close the quote opened on line 1"),
    ("name: t\n\tentrypoint: t.py\n", 2, "a tab in the indentation", "indent line 2 with spaces, not tabs"),
    ("name: t\ncompute:\n  gpus: 1\n cpus: 2\n", 4, "line 4 is indented unlike", "indent line 4 as its siblings"),
])
def test_a_yaml_syntax_error_names_the_line_of_the_mistake_and_the_fix(
        text: str, line: int, message: str, fix: str) -> None:
    """Issue 23 item 6: as schema errors do, with the line where the mistake was made (the parser notices a
    missing ':' or an unclosed '{' only on the next line)."""
    with pytest.raises(ConfigError) as info:
        load_tau_config(text, path="tau.yaml")
    [issue] = info.value.issues
    assert issue["line"] == line and message in str(issue["message"]) and fix in str(issue["fix"])
    head, fix_line = str(info.value).splitlines()
    assert head.startswith(f"tau.yaml:{line}: not valid YAML: ") and fix_line.startswith("    fix: ")


@pytest.mark.parametrize("text", ["active_deadline: 2h\n", "resilience: {timeout: 2h}\n", "timeout: 7200\n"])
def test_a_deadline_written_elsewhere_points_at_run_active_deadline(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_tau_config("name: t\nentrypoint: t.py\n" + text, path="tau.yaml")
    [issue] = info.value.issues
    assert (issue["line"], issue["message"], issue["fix"]) == (
        3, "unknown key; the time limit of one attempt is run.active_deadline",
        "move it to run.active_deadline (seconds, or a duration such as 2h)")
    # a managed manifest keeps TauGrid's warning, and its fix says where the deadline lives
    managed = load_tau_config("schema_version: 1\nname: t\nrun: {entrypoint: t.py}\nresilience: {timeout: 2h}\n")
    [warning] = managed.warnings
    assert "run.active_deadline" in str(warning["fix"])
