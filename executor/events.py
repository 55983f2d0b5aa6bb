"""Where the executor says what happened: the evidence and security event sinks.

Two streams leave the process: *evidence* (``agent-safe.executor-evidence/1``, standard output, one
line per lifecycle event) and *security* (``agent-safe.security/1``, standard error, one line per
thing that happened to the process). Components receive an :class:`EventSink` for each and call
``emit(event, fields)``; they never format lines themselves. The chained, redacted implementation
lives in ``chain.py``; :class:`MemorySink` is for tests and for composing sinks.

Operational logs (Python ``logging``: aiohttp, warnings, the executor's own diagnostics) share
standard error as JSON lines too, :data:`LOG_SCHEMA` with a ``level`` field, formatted by
:class:`JsonLogFormatter`; nothing on standard error is plain text (``serve.py`` installs it).

Fields must never carry request parameters, provider bodies or secret values.

Callers: main callers; it is imported across the wings, and its importers are not listed.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from .clock import format_ms
from .codes import Code

__all__ = [
    "EVIDENCE_SCHEMA",
    "GENESIS_HASH",
    "LOG_SCHEMA",
    "SECURITY_SCHEMA",
    "DeferredSink",
    "EventSink",
    "JsonLinesSink",
    "JsonLogFormatter",
    "MemorySink",
    "Streams",
    "security_level",
]

EVIDENCE_SCHEMA = "agent-safe.executor-evidence/1"
SECURITY_SCHEMA = "agent-safe.security/1"
LOG_SCHEMA = "agent-safe.log/1"

_ROUTINE_SECURITY_EVENTS = frozenset(
    {
        "LISTENING",
        "STOPPING",
        "RESUMED",
        "CHAIN_RESUMED",
        "JWKS_RELOADED",
        "SECRET_ROTATED",
        "TLS_CONTEXT_ROTATED",
        "AUTHORITY_KEY_ROTATED",
        "POSTURE_RESTORED",
        "BEARER_PRINCIPAL_CONFIGURED",
        "APPROVAL_NOTIFIED",
        "RECONCILIATION",
        "SHADOW_REPORT",
        "HANDLERS_REGISTERED",
        "STORE_OPENED",
        "STORE_AVAILABLE",
        "JOURNAL_RECOVERED",
        "CHAIN_HEADS_RECOVERED",
        "HALT_CAUSE_LIFTED",
    }
)
_ERROR_SECURITY_EVENTS = frozenset({Code.REFUSED_TO_START, "LEAK_SUSPECTED"})


def security_level(event: str) -> str:
    """The ``level`` of a security line: ``INFO`` for what a running executor does routinely
    (listening, stopping, a rotation that took, its handlers and store at start, a journal, store
    or halt cause that recovered), ``ERROR`` for a refusal to start and a suspected
    leak, ``WARNING`` for everything else the stream exists to report (a halt, a refusal, a
    waived or drifted posture, an egress refusal)."""
    if event in _ROUTINE_SECURITY_EVENTS:
        return "INFO"
    return "ERROR" if event in _ERROR_SECURITY_EVENTS else "WARNING"


GENESIS_HASH = "sha256:" + "0" * 64
"""The ``prev_hash`` of a chain's first line (``evidence/chain.py`` writes it, ``chainverify.py``
checks it)."""


class EventSink(Protocol):
    """One output stream of structured events."""

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None: ...


class JsonLinesSink:
    """An unchained JSON-lines sink; one ``write`` per line so lines never interleave."""

    def __init__(self, stream: TextIO, *, schema: str) -> None:
        self._stream = stream
        self._schema = schema
        self._lock = threading.Lock()

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        line = {
            "schema": self._schema,
            "event": event,
            "at": format_ms(time.time()),
            **(fields or {}),
        }
        if self._schema == SECURITY_SCHEMA:
            line.setdefault("level", security_level(event))
        text = json.dumps(line, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self._stream.write(text)
            self._stream.flush()


class JsonLogFormatter(logging.Formatter):
    """One ``logging`` record as one JSON line: ``schema``, ``at``, ``level`` (``DEBUG`` ..
    ``CRITICAL``), ``logger``, ``message`` and, with an exception, ``exception`` (the traceback
    as one string, so a multi-line traceback is still one line). Put a redacting filter before
    it: it formats what the record holds."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "schema": LOG_SCHEMA,
            "at": format_ms(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        code = getattr(record, "code", None)
        if code is not None:
            line["code"] = str(code)
        return json.dumps(line, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass
class MemorySink:
    """Keeps events in memory; used by tests and the shadow report."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        self.events.append((event, dict(fields or {})))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [f for e, f in self.events if e == event]


@dataclass(frozen=True)
class Streams:
    """The pair of sinks every component is handed."""

    evidence: EventSink
    security: EventSink

    @classmethod
    def standard(cls) -> Streams:
        return cls(
            evidence=JsonLinesSink(sys.stdout, schema=EVIDENCE_SCHEMA),
            security=JsonLinesSink(sys.stderr, schema=SECURITY_SCHEMA),
        )

    @classmethod
    def memory(cls) -> Streams:
        return cls(evidence=MemorySink(), security=MemorySink())


class DeferredSink:
    """Holds events until the real sink exists, then forwards everything in order.

    ``serve`` raises security events (posture waivers, secret checks) before the journal
    directory, and so the chain heads, can be opened; this keeps them for the chain. If start-up
    fails first, :meth:`drain` hands them to a plain sink so nothing is lost.
    """

    def __init__(self) -> None:
        self._buffer: list[tuple[str, dict[str, Any]]] = []
        self._target: EventSink | None = None
        self._lock = threading.Lock()

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        with self._lock:
            if self._target is None:
                self._buffer.append((event, dict(fields or {})))
                return
            target = self._target
        target.emit(event, fields)

    def attach(self, target: EventSink) -> None:
        with self._lock:
            buffered, self._buffer = self._buffer, []
            for event, fields in buffered:
                target.emit(event, fields)
            self._target = target

    @property
    def attached(self) -> bool:
        return self._target is not None

    def drain(self, target: EventSink) -> None:
        """Send what is buffered to ``target`` (start-up failed before the chain opened)."""
        with self._lock:
            buffered, self._buffer = self._buffer, []
        for event, fields in buffered:
            target.emit(event, fields)
