"""The one table from nats-py's exceptions to taugrid's errors (``taugrid.core.errors``).

No module of ``taugrid.bus`` but this one names a nats-py exception class in an ``except``, a ``suppress`` or an
``isinstance`` (``tests/bus/test_errors.py`` holds them to it): each catches one of the rows below, so what a
failure means (absent, a lost race, unavailable) is decided in one place. ``Bus.replies`` raises nats-py's own
classes where nats-py's request would (a timeout, no responders, an ``APIError`` in a publish ack), so the same
rows classify its failures. Not every call is wrapped yet: a nats-py error
outside the rows a path catches still leaves ``kv.filtered_values``, ``replay.follow``, ``platformstore``'s writes
and follow, a publish ack's ``APIError`` in ``Bus.publish``, ``bootstrap`` and ``dlq`` as it is.

| row | nats-py raises | what it means | taugrid's answer |
|---|---|---|---|
| ``KEY_ABSENT`` | ``KeyNotFoundError``, ``KeyDeletedError`` | no such KV key, or deleted | None |
| ``OBJECT_GONE`` | ``ObjectNotFoundError``, ``ObjectDeletedError`` | no such object, or deleted | None, ``NotFound`` |
| ``OBJECT_ABSENT`` | those and ``NotFoundError`` | no object, or no store | None, ``NotFound`` |
| ``MISSING`` | ``NotFoundError`` (404) | no such stream, consumer, message | None, 0, nothing; ``NotFound`` |
| ``NO_BUCKET`` | ``BucketNotFoundError`` | a bucket or store not made yet | made (bootstrap), or skipped |
| ``NO_KEYS`` | ``NoKeysError`` | a bucket without keys | an empty list |
| ``WRONG_LAST`` | ``KeyWrongLastSequenceError`` (and ``conflicted``) | a compare-and-set lost | ``kv.Conflict`` |
| ``REFUSED`` | ``APIError`` | the JetStream API said no | by ``err_code`` (10071, 10164: lost) |
| ``NO_RESPONDERS`` | ``NoRespondersError`` | nobody answers the subject | ``TemporaryError`` |
| ``DAMAGED`` | ``DigestMismatchError`` | an object arrived damaged | ``TemporaryError`` |
| ``DENIED`` | ``AuthorizationError`` | the server refused the credentials | ``PermissionDenied`` |
| ``TIMEOUT`` | ``TimeoutError`` (nats-py's is one) | no answer in time | ``TemporaryError``; a poll: nothing yet |
| ``CLOSED`` | ``ConnectionClosedError`` | this connection was closed | the loop stops |
| ``UNAVAILABLE`` | any ``nats.errors.Error``, a timeout | the bus cannot answer now | ``unavailable``: temporary |

A refusal for the identity's permissions is not an exception nats-py raises at the call: the server says it on
the connection, and ``Bus.guarded`` raises ``PermissionDenied`` (a ``PermanentError``) from its error callback.

Two kinds of handlers, and why both go through these names:

- a handler that *classifies* (the bus cannot answer, the write lost a race) turns the row into taugrid's error,
  ``unavailable`` for the commonest (``TemporaryError``, with what was being done and the cause);
- a handler that catches one precise row for *control flow* (``KEY_ABSENT`` meaning "answer None",
  ``MISSING`` meaning "create it", ``TIMEOUT`` in a poll meaning "nothing yet") answers itself: the row only names
  the classes, so a reader sees the meaning and the table stays the one list of nats-py's exceptions.

Rows overlap (``KEY_ABSENT`` is a ``MISSING``, and every row an ``UNAVAILABLE``): a handler lists the narrow row
before the wide one, as Python's ``except`` clauses are tried in order.
"""

from __future__ import annotations

import nats

from taugrid.core.errors import TemporaryError

KEY_ABSENT: tuple[type[Exception], ...] = (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError)
OBJECT_GONE: tuple[type[Exception], ...] = (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError)
OBJECT_ABSENT: tuple[type[Exception], ...] = (*OBJECT_GONE, nats.js.errors.NotFoundError)
MISSING: tuple[type[Exception], ...] = (nats.js.errors.NotFoundError,)
NO_BUCKET: tuple[type[Exception], ...] = (nats.js.errors.BucketNotFoundError,)
NO_KEYS: tuple[type[Exception], ...] = (nats.js.errors.NoKeysError,)
WRONG_LAST: tuple[type[Exception], ...] = (nats.js.errors.KeyWrongLastSequenceError,)
REFUSED: tuple[type[Exception], ...] = (nats.js.errors.APIError,)
NO_RESPONDERS: tuple[type[Exception], ...] = (nats.errors.NoRespondersError,)
DAMAGED: tuple[type[Exception], ...] = (nats.js.errors.DigestMismatchError,)
DENIED: tuple[type[Exception], ...] = (nats.errors.AuthorizationError,)
TIMEOUT: tuple[type[Exception], ...] = (nats.errors.TimeoutError, TimeoutError)
CLOSED: tuple[type[Exception], ...] = (nats.errors.ConnectionClosedError,)
UNAVAILABLE: tuple[type[Exception], ...] = (nats.errors.Error, TimeoutError)

WRONG_LAST_CODES = (10071, 10164)  # the server's "wrong last sequence" error codes (nats-py's ``update`` reads these)


def conflicted(exc: BaseException) -> bool:
    """Whether ``exc`` says a compare-and-set lost (``WRONG_LAST``): nats-py's own class, or the server's
    ``APIError`` with a wrong-last-sequence code, as a write sent through ``Bus.replies`` gets it back."""
    if isinstance(exc, WRONG_LAST):
        return True
    return isinstance(exc, REFUSED) and getattr(exc, "err_code", None) in WRONG_LAST_CODES


def unavailable(doing: str, exc: BaseException, *, delay: float = 1.0) -> TemporaryError:
    """The ``UNAVAILABLE`` row's answer: "``doing`` failed", with the cause, to be tried again after ``delay``."""
    return TemporaryError(f"{doing} failed: {exc!r}", delay=delay)
