"""Giving the C heap's free pages back to the system after a large one-off allocation.

glibc's ``free`` returns memory to the system only from the top of the heap; pages freed in the middle (a parse's
temporaries below the objects it keeps) stay resident until ``malloc_trim`` releases them. A service calls
``trim`` after such a peak (a new platform revision parsed), never per message: a trim walks the whole heap.
Elsewhere than glibc (musl, macOS) there is no ``malloc_trim`` and ``trim`` does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc
        return None
    return trim


def trim() -> bool:
    """Release the heap's free pages to the system; whether any were released (False where there is no glibc)."""
    malloc_trim = _malloc_trim()
    return bool(malloc_trim(0)) if malloc_trim is not None else False
