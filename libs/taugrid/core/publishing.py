"""Which service may publish which subjects (pure: no I/O), as the ``ce-source`` check every consumer makes sees it
(and, with server authentication on, behind each service user's NATS publish permissions).

A service names itself in ``ce-source`` as ``/svc/<service>``. Events people publish (``PERSON_REQUESTS``)
carry a signature instead (``envelope.verify_signature``): the submitter and the renderer check it, so their
``ce-source`` is not what authorizes them. Everything else on a checked stream must come from a service that
this table allows to publish that subject, or the consumer dead-letters it with the reason and never acts on
it. Without server permissions anyone can still *claim* a ``ce-source``; the check stops events from the wrong
stage (a test harness, a misrouted service, a careless forgery), the server's permissions stop the rest.
"""

from __future__ import annotations

from collections.abc import Iterable

from taugrid.core.events import HIGH_LANE

# service (as in ce-source /svc/<service>) → subjects it publishes (NATS wildcards).
SERVICE_PUBLISH: dict[str, tuple[str, ...]] = {
    "submitter": ("run.*.*.submit.accepted", f"run.*.*.submit.accepted.{HIGH_LANE}", "run.*.*.submit.rejected"),
    "policy": ("run.*.*.policy.approved", f"run.*.*.policy.approved.{HIGH_LANE}", "run.*.*.policy.rejected"),
    "renderer": ("run.*.*.render.applied", "run.*.*.render.failed", "run.*.*.exec.cancelled",
                 "run.*.*.cancel.accepted", "run.*.*.cancel.refused", "backend.>"),
    "admission-watcher": ("run.*.*.admission.>", "run.*.*.exec.>"),
    "recovery": ("run.*.*.recovery.retrying", "run.*.*.recovery.gave_up"),
    "evidence": ("run.*.*.evidence.sealed",),
    # nominations and withdrawals go to the clusters as backend requests (a reservation, the winner's apply, in
    # the run's lane; a withdrawal), and the chosen cluster's object changes pass on to K8S
    # (k8s.<cluster>.<kind>.<ns>.<name>.<change>); a site's reports never come from it
    "dispatcher": ("run.*.*.dispatch.>", "backend.*.reserve", f"backend.*.reserve.{HIGH_LANE}", "backend.*.apply",
                   f"backend.*.apply.{HIGH_LANE}", "backend.*.delete", "k8s.*.*.*.*.*"),
    "health-monitor": ("run.*.*.health.degraded", "node.*.condition.>", "node.*.cordon", "node.*.uncordon",
                       "node.*.repair"),
    "node-agent": ("node.*.sample", "node.*.validation", "node.*.repair"),
    "local-cluster": ("k8s.local.>", "log.>"),
    "log-shipper": ("log.>",),
    "kube-bridge": ("k8s.>",),
    # a person's cancel, signed by the portal with the person's delegation token (access/delegation.py)
    "portal": ("run.*.*.cancel.requested",),
}

# Requests a person publishes, signed with their nkey; authorized by the signature, not by ce-source.
PERSON_REQUESTS: tuple[str, ...] = ("run.*.*.submit.requested", f"run.*.*.submit.requested.{HIGH_LANE}",
                                     "run.*.*.cancel.requested")

# Streams whose consumers check ce-source (LOGS is only read by people; DLQ is never acted on). SITE_IN is a site's
# copy of its BACKEND requests (bus/sites.py), checked at the site against the hub's keys copied there.
CHECKED_STREAMS = frozenset({"RUNS", "K8S", "NODES", "BACKEND", "SITE_IN"})

SOURCE_PREFIX = "/svc/"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a trailing ``>`` one or more."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def matches_any(patterns: Iterable[str], subject: str) -> bool:
    return any(subject_matches(p, subject) for p in patterns)


def may_publish(service: str, subject: str) -> bool:
    return matches_any(SERVICE_PUBLISH.get(service, ()), subject)


def publishers(subject: str) -> list[str]:
    """The services allowed to publish ``subject`` (sorted)."""
    return sorted(s for s in SERVICE_PUBLISH if may_publish(s, subject))


def is_person_request(subject: str) -> bool:
    return matches_any(PERSON_REQUESTS, subject)


def _literal_positions() -> dict[str, frozenset[int]] | None:
    """First token → the positions where some pattern starting with it has a literal token (None when a pattern
    starts with a wildcard: then no subject can be shortened safely)."""
    out: dict[str, set[int]] = {}
    for pattern in [*PERSON_REQUESTS, *(p for ps in SERVICE_PUBLISH.values() for p in ps)]:
        tokens = pattern.split(".")
        if tokens[0] in ("*", ">"):
            return None
        out.setdefault(tokens[0], set()).update(i for i, t in enumerate(tokens) if t not in ("*", ">"))
    return {k: frozenset(v) for k, v in out.items()}


_LITERAL = _literal_positions()
_VERDICTS: dict[str, tuple[bool, tuple[str, ...]]] = {}
_VERDICTS_MAX = 4096


def verdict(subject: str) -> tuple[bool, tuple[str, ...]]:
    """(is a person's request, the services allowed to publish it) for ``subject``, remembered by its shape:
    the subject with every token no pattern compares literally replaced by ``*`` (run ids, names), which
    matches exactly the patterns the subject matches (same length; every literal a pattern of its first token
    compares is kept). Every consumer checks every event, so this sits on every hop; the memory is bounded."""
    tokens = subject.split(".")
    keep = _LITERAL.get(tokens[0]) if _LITERAL is not None else None
    shape = subject if keep is None else ".".join(t if i in keep else "*" for i, t in enumerate(tokens))
    known = _VERDICTS.get(shape)
    if known is None:
        known = (is_person_request(shape), tuple(publishers(shape)))
        if len(_VERDICTS) >= _VERDICTS_MAX:
            _VERDICTS.clear()
        _VERDICTS[shape] = known
    return known


def source_problem(subject: str, source: str) -> str | None:
    """Why an event on ``subject`` claiming ``ce-source: source`` must not be acted on; None when it may be.
    Person requests always pass here (their signature is checked where they are handled)."""
    person, allowed = verdict(subject)
    if person:
        return None
    service = source.removeprefix(SOURCE_PREFIX) if source.startswith(SOURCE_PREFIX) else ""
    if service and service in allowed:
        return None
    expected = ", ".join(f"{SOURCE_PREFIX}{s}" for s in allowed) or "no service"
    return f"ce-source {source or '(none)'!r} may not publish {subject}; only {expected} may"
