"""Fuzzed configs (tests/config/fuzzdocs.py): no tau.yaml or platform.yaml document crashes the parser or policy's
resolution; each is accepted or refused with every issue naming its field (or the document, for YAML itself)
and a fix; the policy, resolving from the submitter's record of an accepted config, answers as it would from the
parsed config (the config is parsed once: ``config.accepted``). The suite runs 200 per parser;
bench/fuzz_config.py runs 10,000 and more."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from taugrid.config import accepted
from taugrid.config.machine import default_platform
from taugrid.config.platform import Platform, load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import TauConfig, config_hash, load_tau_config, tau_json_schema
from taugrid.core.errors import ConfigError
from tests.config.fuzzdocs import document

MACHINE = default_platform(8, 32 << 30, ["gpu0", "gpu1"], output_root="/runs")
TAU_BASE = {"name": "fuzz", "entrypoint": "train.py"}
PLATFORM_SCHEMA = Platform.model_json_schema()
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def named(err: ConfigError) -> None:
    assert err.issues, str(err)
    for issue in err.issues:
        assert issue["message"] and issue["fix"], issue
        assert issue["field"] or issue["message"].startswith(DOCUMENT_WIDE), issue


DOCUMENT_WIDE = ("not valid YAML", "the document", "tau.yaml", "platform.yaml", "YAML")


def resolved(cfg: TauConfig) -> Any:
    """The policy's answer: the resolved run, or the ``ConfigError`` with every issue (each checked ``named``)."""
    try:
        return resolve_run(cfg, MACHINE, run_id="fuzz-0", submission_id="s", workspace=None, platform_revision=1,
                           config_hash=config_hash(cfg))
    except ConfigError as err:
        named(err)
        return err


def check_tau(text: str) -> str:
    try:
        cfg = load_tau_config(text)
    except ConfigError as err:
        named(err)
        return "refused"
    rec = accepted.record(cfg)
    answer = resolved(cfg)
    again = resolved(accepted.rebuild(rec.config, path="tau.yaml", lines=rec.lines, managed=rec.managed))
    if isinstance(answer, ConfigError):
        assert isinstance(again, ConfigError) and again.issues == answer.issues, (answer, again)
        return "refused by policy"
    assert again == answer
    return "accepted"


def check_platform(text: str) -> str:
    try:
        load_platform(text)
    except ConfigError as err:
        named(err)
        return "refused"
    return "accepted"


@FUZZ
@given(document(tau_json_schema(), base=TAU_BASE))
def test_no_tau_yaml_crashes_the_parser_or_policy(text: str) -> None:
    check_tau(text)


@FUZZ
@given(document(PLATFORM_SCHEMA))
def test_no_platform_yaml_crashes_the_parser(text: str) -> None:
    check_platform(text)


def test_the_fuzzer_reaches_every_outcome() -> None:
    """A check that cannot fail is no check: the generator must produce accepted and refused documents alike."""
    seen: dict[str, Any] = {}

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(document(tau_json_schema(), base=TAU_BASE))
    def sample(text: str) -> None:
        seen.setdefault(check_tau(text), text)

    sample()
    assert {"refused", "accepted"} <= set(seen), seen
