"""Random identifiers: RFC 9562 version 4 UUIDs, as ``uuid.uuid4()`` makes them, only cheaper.

``uuid.uuid4()`` reads 16 bytes from the OS for every identifier, and ``os.urandom`` releases the
GIL around that ``getrandom`` call: on the event loop, every identifier was a chance for the use
store's or the journal's thread to take the interpreter and keep it for a switch interval. A
request makes five to seven identifiers. :func:`uuid4_text` reads the same CSPRNG 4 KiB at a time
(256 identifiers a read) and formats the text directly; each byte is used once, so the
identifiers are exactly as random and as unpredictable as ``uuid4()``'s. The pool is dropped in a
forked child (``os.register_at_fork``), so a parent and its worker never hand out the same bytes.
``tests/test_ids.py`` holds the formatting to ``str(uuid.UUID(bytes=..., version=4))``.

Hand-written because no library pools the bytes; the standard library formats per identifier.

Callers: intent capture in the lifecycle pipeline (``intent_id``), the policy authority
(decision, dossier and grant ids), the attempt (``attempt_id``), escalations (``request_id``).
Also imported by ``lifecycle/attempt.py``, ``lifecycle/pipeline.py``, ``policy/authority.py``.
"""

from __future__ import annotations

import os
import threading

__all__ = ["format_uuid4", "uuid4_text"]

_POOL_BYTES = 4096

_lock = threading.Lock()
_pool = b""
_offset = 0


def _drop_pool() -> None:
    global _pool, _offset, _lock
    _pool, _offset = b"", 0
    _lock = threading.Lock()  # a lock held by another thread at fork would never be released


os.register_at_fork(after_in_child=_drop_pool)


def format_uuid4(raw: bytes) -> str:
    """The text of the version 4 UUID made of 16 random bytes (version and variant bits set)."""
    if len(raw) != 16:
        raise ValueError("a UUID is 16 bytes")
    h = raw.hex()
    return f"{h[0:8]}-{h[8:12]}-4{h[13:16]}-{(int(h[16], 16) & 0x3) | 0x8:x}{h[17:20]}-{h[20:32]}"


def uuid4_text() -> str:
    """A fresh random version 4 UUID as text, like ``str(uuid.uuid4())``."""
    global _pool, _offset
    with _lock:
        if _offset + 16 > len(_pool):
            _pool, _offset = os.urandom(_POOL_BYTES), 0
        raw = _pool[_offset : _offset + 16]
        _offset += 16
    return format_uuid4(raw)
