"""A ``tau.yaml`` as the submitter accepted it, and the typed config rebuilt from that record.

The config is parsed once, by the submitter (``load_tau_config``: YAML, a managed manifest's projection, the
rules). What it accepted travels on ``submit.accepted`` as ``Accepted`` (``record``): the validated model as JSON
values with its aliases folded and every field at its default left out (issue 27: a trivial config's ~670 B were
~500 B of defaults the model gives back), and whether it was a managed manifest. A record of an earlier release,
its defaults written out, rebuilds the same. The line of each key the file spelled out (``lines``) no longer
travels (issue 27): it only places a refusal's keys, and the policy reads it back from the request's text when it
refuses (``services/policy/keylines``); an earlier release's record carries it.
The policy resolves from ``rebuild`` of that record: pydantic re-validates the folded mapping into the typed
model, with no YAML, no projection and no reading of the user's text. The text is not copied onto the event
(issue 27): the evidence seals it from the ``submit.requested`` this answers; no stage parses it again.

Trust: the record is only ever read from a ``submit.accepted``, which only the submitter may publish (its
``ce-source`` and service signature are checked by the consumer before any handler runs), the same trust the
policy gave ``config_text`` on that event before.

Invariant: ``rebuild`` of ``record(cfg)`` resolves as ``cfg`` does: the same ``config_hash``, the same
``written`` keys and lines, the same ``managed`` (tests/config/test_fuzz.py and tests/config/test_accepted.py),
as long as its key lines fit ``ACCEPTED_LINES_MAX_BYTES`` (each line names its key's whole path; the bound was
the event's, and the policy's read-back keeps it so that a refusal reads as before): past that only the shallowest
keys' lines are kept, and an issue about a deeper key names its nearest kept parent's line.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pydantic

from taugrid.config.source import pydantic_issues, raise_issues
from taugrid.config.taujob import ELSEWHERE, TauConfig, config_hash
from taugrid.core.limits import ACCEPTED_LINES_MAX_BYTES

# (key path, line): a key's line in the user's text, as the JSON a msgspec event carries
KeyLine = tuple[tuple[str | int, ...], int]


class Accepted(NamedTuple):
    config: dict[str, Any]  # the validated model as JSON values, aliases folded, no null keys, no defaults
    config_hash: str
    lines: list[KeyLine]
    managed: bool


def record(cfg: TauConfig) -> Accepted:
    """What ``submit.accepted`` carries of a config the submitter parsed and accepted."""
    return Accepted(
        # a field at its default is what validation gives back when it is absent (``engine``, which validation
        # infers, is never at its default None once validated), so leaving it out changes nothing rebuilt
        config=cfg.model_dump(mode="json", exclude_none=True, exclude_defaults=True),
        config_hash=config_hash(cfg),
        lines=_shallowest(cfg._lines, ACCEPTED_LINES_MAX_BYTES),
        managed=cfg.managed,
    )


def _shallowest(lines: dict[tuple[str | int, ...], int], budget: int) -> list[KeyLine]:
    """The key lines, shallowest first (in document order within a depth), while their JSON fits ``budget``."""
    kept: list[KeyLine] = []
    for path, line in sorted(lines.items(), key=lambda item: len(item[0])):  # stable: document order kept
        budget -= len(msgspec.json.encode((path, line))) + 1  # and its comma
        if budget < 0:
            break
        kept.append((path, line))
    return kept


def rebuild(config: dict[str, Any], *, path: str, lines: list[KeyLine], managed: bool) -> TauConfig:
    """The typed config of an accepted record (a ``submit.accepted`` from before ``config_lines`` existed rebuilds
    with no lines: the policy's issues then name fields without a line). Raises ``ConfigError`` only when this
    version's model refuses what another version of the submitter accepted."""
    try:
        cfg = TauConfig.model_validate(config)
    except pydantic.ValidationError as exc:
        known = {tuple(p): n for p, n in lines}
        raise_issues(pydantic_issues(exc, TauConfig, file=path, lines=known, elsewhere=ELSEWHERE))
        raise  # unreachable: pydantic never reports zero errors
    cfg._path, cfg._lines, cfg._managed = path, {tuple(p): n for p, n in lines}, managed
    return cfg
