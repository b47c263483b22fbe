"""One exception tree for the whole library.

Handlers raise these; the bus adapter maps them to JetStream verbs: permanent → term (and DLQ), temporary →
nak with delay, anything else → unknown (nak with a longer delay, never counted as a run failure).
"""

from __future__ import annotations


class TauError(Exception):
    """Root of every taugrid error."""


class PermanentError(TauError):
    """Retrying cannot help: bad input, a contract violation. The message says what to fix."""


class TemporaryError(TauError):
    """Retry after a delay: a dependency is unavailable or a compare-and-set lost a race."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class NotYet(TemporaryError):
    """Not due yet: handle it again in exactly ``delay`` seconds (a scheduled wait, such as a paced submission's
    slot), not after a delay that grows with each delivery as a ``TemporaryError``'s does."""


class ConfigError(PermanentError):
    """A ``tau.yaml`` or ``platform.yaml`` is invalid. ``issues`` lists each problem with its field path."""

    def __init__(self, message: str, *, issues: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        self.issues = issues or []


class NotFound(TauError):
    """An object (run, workspace, queue) does not exist."""


class BackendError(TauError):
    """A backend (Kubernetes, local cluster) refused or failed an operation."""


class PermissionDenied(PermanentError):
    """The bus (or a service) refused an action this identity is not allowed to take. Never retried."""
