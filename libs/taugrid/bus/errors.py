"""The one table from nats-py's exceptions to taugrid's errors (``taugrid.core.errors``).

The adapter's modules classify what nats-py raises through these names, so no nats exception leaves
``taugrid.bus`` and no other package needs to know nats-py's exception tree:

- ``KEY_ABSENT`` (a KV key not found or deleted), ``OBJECT_ABSENT`` (an object or its stream not found): the
  helper's "absent" answer (None) or ``NotFound``;
- ``WRONG_LAST`` (a compare-and-set lost: the key is not at the revision read): ``kv.Conflict``, a
  ``TemporaryError`` (read again and redo the change);
- a publish or request the server refuses for the identity's permissions: ``PermissionDenied``
  (``Bus.guarded``, from the connection's error callback);
- ``TIMEOUT`` (a wait that ended without an answer) and the rest of ``UNAVAILABLE`` (any other
  ``nats.errors.Error``): ``TemporaryError``, the bus cannot answer now, try again after a delay.
"""

from __future__ import annotations

import nats

KEY_ABSENT: tuple[type[Exception], ...] = (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError)
OBJECT_ABSENT: tuple[type[Exception], ...] = (
    nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError, nats.js.errors.NotFoundError)
WRONG_LAST: tuple[type[Exception], ...] = (nats.js.errors.KeyWrongLastSequenceError,)
TIMEOUT: tuple[type[Exception], ...] = (nats.errors.TimeoutError, TimeoutError)
UNAVAILABLE: tuple[type[Exception], ...] = (nats.errors.Error, TimeoutError)
