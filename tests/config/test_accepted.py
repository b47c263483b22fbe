"""The config parsed once: what the submitter records of a parsed tau.yaml on ``submit.accepted``, carried as that
event's JSON, rebuilds into a config the policy resolves exactly as the parsed one (the same run, or the same
refusals at the same lines), for every config of TauGrid's that loads and for managed manifests; a record this
version's model refuses is refused naming the field and its line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.config import accepted
from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import TauConfig, config_hash, load_tau_config
from taugrid.core.contracts import SubmitAccepted
from taugrid.core.errors import ConfigError
from taugrid.core.limits import ACCEPTED_LINES_MAX_BYTES, EVENT_MAX_BYTES

HERE = Path(__file__).resolve().parent / "taugrid"
PLATFORM = load_platform((HERE / "platform.yaml").read_text())
CONFIGS = sorted(HERE.rglob("*.yaml"))


def _loads(path: Path) -> bool:
    try:
        load_tau_config(path.read_text(), path=path.name)
    except ConfigError:
        return False
    return True


LOADING = [p for p in CONFIGS if p.name != "platform.yaml" and _loads(p)]


def over_the_wire(cfg: TauConfig) -> TauConfig:
    """``cfg`` as the policy sees it: recorded by the submitter, sent as submit.accepted's JSON, rebuilt."""
    rec = accepted.record(cfg)
    event = SubmitAccepted(submission_id="s", config=rec.config, config_hash=rec.config_hash,
                           config_path=cfg.source_path, config_lines=rec.lines, config_managed=rec.managed)
    got = msgspec.json.decode(msgspec.json.encode(event), type=SubmitAccepted)
    return accepted.rebuild(got.config, path=got.config_path, lines=got.config_lines, managed=got.config_managed)


def resolved(cfg: TauConfig) -> Any:
    """The policy's answer for ``cfg``: the resolved run, or every refusal (field, line, message, fix)."""
    try:
        return resolve_run(cfg, PLATFORM, run_id="r-0a1b2c", submission_id="s-1", workspace=None,
                           platform_revision=1, config_hash=config_hash(cfg))
    except ConfigError as err:
        return [(i["field"], i["line"], i["message"], i["fix"]) for i in err.issues]


def test_the_ported_configs_are_enough_to_mean_something() -> None:
    assert len(LOADING) >= 30
    assert any(load_tau_config(p.read_text()).managed for p in LOADING)


@pytest.mark.parametrize("path", LOADING, ids=lambda p: str(p.relative_to(HERE)))
def test_a_recorded_config_resolves_as_the_parsed_one(path: Path) -> None:
    cfg = load_tau_config(path.read_text(), path=path.name)
    back = over_the_wire(cfg)
    assert back.model_dump(mode="json") == cfg.model_dump(mode="json")
    assert (config_hash(back), back._lines, back.managed, back.source_path) == (
        config_hash(cfg), cfg._lines, cfg.managed, path.name)
    assert resolved(back) == resolved(cfg)


def test_a_refusal_at_resolution_keeps_the_line_the_user_wrote_it_on() -> None:
    text = "name: t\nentrypoint: t.py\npolicy:\n  profile: no-such-profile\n"
    back = over_the_wire(load_tau_config(text, path="sub/tau.yaml"))
    [issue] = resolved(back)
    assert issue[:2] == ("policy.profile", 4)
    assert back.written("policy", "profile") and not back.written("compute", "gpus")


def test_a_record_leaves_out_every_default_and_one_written_whole_rebuilds_the_same() -> None:
    """Issue 27: submit.accepted carries the fields that differ from the model's defaults, nothing more; a record
    of an earlier release, every default written out, is the same config."""
    text = ("name: store\nentrypoint: sim.py\ncompute: {gpus: 0, cpu_request: '1', memory_request: 1Mi}\n"
            "runtime: {env: {SIMULATED_DURATION: '0.05'}}\n")
    cfg = load_tau_config(text)
    rec = accepted.record(cfg)
    assert rec.config == {"name": "store", "engine": "job", "entrypoint": "sim.py",
                          "runtime": {"env": {"SIMULATED_DURATION": "0.05"}},
                          "compute": {"gpus": 0, "cpu_request": "1", "memory_request": "1Mi"}}
    whole = cfg.model_dump(mode="json", exclude_none=True)  # what earlier releases recorded
    assert whole["resilience"]["retry_on"] == ["Preempted", "Evicted"] and "resilience" not in rec.config
    for config in (rec.config, whole):
        back = accepted.rebuild(config, path="tau.yaml", lines=rec.lines, managed=False)
        assert (back.model_dump(mode="json"), config_hash(back), resolved(back)) == (
            cfg.model_dump(mode="json"), config_hash(cfg), resolved(cfg))


def test_a_record_from_before_lines_were_carried_resolves_without_them() -> None:
    cfg = load_tau_config("name: t\nentrypoint: t.py\npolicy:\n  profile: no-such-profile\n")
    back = accepted.rebuild(accepted.record(cfg).config, path="tau.yaml", lines=[], managed=False)
    assert [i[:2] for i in resolved(back)] == [("policy.profile", None)]


def test_a_record_this_model_refuses_names_the_field_and_its_line() -> None:
    with pytest.raises(ConfigError) as info:
        accepted.rebuild({"name": "t", "entrypoint": "t.py", "compute": {"gpuz": 1}}, path="tau.yaml",
                         lines=[(("compute",), 3), (("compute", "gpuz"), 4)], managed=False)
    [issue] = info.value.issues
    assert (issue["field"], issue["line"]) == ("compute.gpuz", 4)
    assert "gpus" in str(issue["message"])


def test_the_key_lines_of_a_config_with_long_paths_stay_within_their_budget_shallowest_first() -> None:
    """Each line names its key's whole path: 3,000 keys under one 1,000-character key were 3 MB of lines for a
    45 KB config, past what an event may carry."""
    text = ("name: t\nentrypoint: t.py\nexecution:\n  configs:\n    " + "k" * 1000 + ":\n"
            + "".join(f"      c{i}: 1\n" for i in range(3000)))
    cfg = load_tau_config(text)
    rec = accepted.record(cfg)
    assert len(msgspec.json.encode(rec.lines)) <= ACCEPTED_LINES_MAX_BYTES < len(msgspec.json.encode(
        list(cfg._lines.items())))
    event = SubmitAccepted(submission_id="s", config=rec.config, config_hash=rec.config_hash, config_text=text,
                           config_lines=rec.lines)
    assert len(msgspec.json.encode(event)) < EVENT_MAX_BYTES
    depths = [len(p) for p, _ in rec.lines]
    assert depths == sorted(depths) and depths[:5] == [1, 1, 1, 2, 3]
    assert dict(rec.lines)[("execution", "configs", "k" * 1000)] == 5
    back = over_the_wire(cfg)
    assert back.line("execution", "configs", "k" * 1000, "c2999") == 5  # its nearest kept parent
    assert (back.written("entrypoint"), resolved(back)) == (True, resolved(cfg))
