"""The chained, redacted evidence streams: what the executor writes to stdout and stderr.

:class:`ChainedSink` implements ``events.EventSink``. Every emitted event becomes one line::

    {"at": "...", "event": "...", ...fields, "prev_hash": "sha256:...", "schema": "...", "seq": n,
     "hash": "sha256:..."}

written as RFC 8785 canonical JSON plus ``"\\n"``, where ``hash`` is ``canonical.sha256_digest``
of the line without ``hash`` and ``prev_hash`` is the previous line's ``hash``. The first line of
a fresh chain has ``seq`` 1, ``prev_hash`` :data:`GENESIS_HASH` and ``"genesis": true``.
Under ``EXECUTOR_WORKERS`` above 1 every line also carries ``"worker": <index>`` (hashed like
every field): each worker writes its own two chains, whose heads live in its own journal
directory, and the supervisor interleaves whole lines of all of them on the standard streams.
While tracing is on (``telemetry.py``, docs/tracing.md), a line written inside a traced request
also carries that request's ``trace_id`` (32 hex digits, hashed like every field); with tracing
off (the default) no line has one.

Every string field (keys and values, recursively) passes the :class:`~.redact.Redactor` before it
is hashed; each redaction is reported to ``on_redaction`` with the field path and kind, so the
streams can raise ``LEAK_SUSPECTED`` (see :func:`open_chained_streams`).

With a ``journal_dir`` the head is persisted atomically to
``<journal_dir>/chain/<stream>.head.json`` after the first line a process writes, every
about every ``checkpoint_lines`` lines after that, and at :meth:`ChainedSink.close` (``clean:
true``). A sink opened over an existing head continues the chain with a ``CHAIN_RESUMED`` line:
seamlessly after a clean stop, or after a crash beyond any sequence number the dead process could
have written, with ``gap: true``. A line is never written more than ``checkpoint_lines`` past the
persisted head, so that bound holds even when a checkpoint fails (the sink then refuses to write).

The periodic checkpoints are written by a thread of the sink's own (two ``fsync`` calls each, the
file and its directory), started when the head is three quarters of the way to the bound, so the
caller (the event loop) does not wait on the disk for them; the line that would pass the bound
waits for that checkpoint (or, when it failed, persists the head itself or is refused). The first
line, a resumption and :meth:`ChainedSink.close` persist before they return, as before. The head
file only moves forward: a checkpoint never replaces a newer head (nor a clean one) with an older.
A head that cannot be persisted (a full disk) makes the sink :attr:`~ChainedSink.failed` until a
persist lands again (:meth:`~ChainedSink.recover` is the synced probe); every line written or
refused meanwhile calls ``on_failure``, which ``plane.py`` turns into a halt (cause
``CHAIN_HEADS``): the first failed checkpoint comes a quarter of the bound before lines are
refused, so the halt and its security lines are written while the chain still has room.

The window an incident bundle carries (:meth:`ChainedSink.snapshot`) keeps the last
``window_lines`` lines of two kinds apart: *routine* lines (on the security stream the door's
refusals, which anyone who reaches the listener can cause; ``assembly.py`` names them from
``door/refusal_lines.py``) and
everything else (an operator's ``HALTED``, a ``PRINCIPAL_LOCKED``, a posture drift). A flood of
refusals pushes out only older refusals, never the lines an incident is read by; the snapshot
names the sequence ranges it leaves out between its lines (``elided``), and the bundle's
manifest declares them so the offline walk can tell them from removed lines.

Callers: ``assembly.py`` builds the streams with :func:`open_chained_streams`; ``plane.py``
closes them on SIGTERM; ``serve.py`` writes operational logs through their writer;
``evidence/bundle.py`` (``export_bundle``) reads :meth:`ChainedSink.snapshot`;
``/v1/control/status`` reads the heads. The format is documented in ``docs/evidence.md``.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import io
import itertools
import json
import logging
import os
import secrets
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TextIO

from .. import telemetry
from ..canonical import canonical_text, sha256_digest, sha256_hex
from ..clock import Clock, format_ms
from ..codes import Code
from ..errors import AgentSafeError
from ..events import EVIDENCE_SCHEMA, GENESIS_HASH, SECURITY_SCHEMA, Streams, security_level
from ..host.durable import fsync_directory, write_all
from ..host.heldwrite import HeldDescriptor
from .redact import Redaction, Redactor, clean_line

__all__ = [
    "CHAIN_RESUMED",
    "DEFAULT_CHECKPOINT_LINES",
    "DEFAULT_WINDOW_LINES",
    "GENESIS_HASH",
    "LEAK_SUSPECTED",
    "RESERVED_FIELDS",
    "ChainError",
    "ChainHead",
    "ChainSnapshot",
    "ChainedSink",
    "ChainedStreams",
    "Leak",
    "LineWriter",
    "LineWriterHandler",
    "open_chained_streams",
]

CHAIN_RESUMED = "CHAIN_RESUMED"
LEAK_SUSPECTED = "LEAK_SUSPECTED"
DEFAULT_CHECKPOINT_LINES = 100
DEFAULT_WINDOW_LINES = 5000
HEAD_SCHEMA = "agent-safe.chain-head/1"

#: Fields the sink writes itself; a caller passing one is a programming error.
RESERVED_FIELDS = frozenset(
    {
        "schema",
        "seq",
        "at",
        "event",
        "prev_hash",
        "hash",
        "genesis",
        "resumed_from",
        "gap",
        "worker",
    }
)
_RESERVED_EVENTS = frozenset({CHAIN_RESUMED})

_log = logging.getLogger(__name__)


class ChainError(AgentSafeError):
    """The chain cannot continue safely (head unreadable, journal in use, checkpoint failed)."""

    code = Code.CHAIN_UNAVAILABLE


@dataclass(frozen=True)
class ChainHead:
    """The last line of a stream: what a checkpoint persists and a bundle's manifest claims."""

    stream: str
    schema: str
    seq: int
    hash: str

    def as_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "schema": self.schema, "seq": self.seq, "hash": self.hash}


@dataclass(frozen=True)
class ChainSnapshot:
    """The window of lines (without newlines) and the head they end at, taken atomically.

    ``elided`` lists the inclusive ``(first, last)`` sequence ranges between the window's first
    and last line that it does not hold: routine lines that later routine lines pushed out
    while older protected lines stayed (see :class:`ChainedSink`)."""

    lines: tuple[str, ...]
    head: ChainHead | None
    elided: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Leak:
    """A redaction in a chained line: where (``field`` path) and what kind; never the value."""

    field: str
    kind: str
    secret: str | None


@dataclass(frozen=True)
class _Resumption:
    resumed_from: ChainHead
    gap: bool
    seq: int


class LineWriter:
    """Writes whole lines to a text stream: one ``write`` and a ``flush`` under a lock.

    Share one writer per underlying stream (:meth:`for_stream`) between the chained sink and the
    operational log handler so their lines can never interleave inside a line.

    On the interpreter's own standard output and error (UTF-8, POSIX: no newline translation), a
    line is encoded here and written to the descriptor with the GIL held when that cannot wait
    (``host/heldwrite.py``: a pipe or a regular file): the same bytes, after whatever the stream
    still buffered, without handing the GIL to another thread for the length of a system call.
    A line that could wait (a full pipe, a line longer than ``PIPE_BUF``) is written the ordinary
    way.
    """

    _registry: ClassVar[dict[int, LineWriter]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self._held = _standard_descriptor(stream)

    @classmethod
    def for_stream(cls, stream: TextIO) -> LineWriter:
        with cls._registry_lock:
            writer = cls._registry.get(id(stream))
            if writer is None or writer.stream is not stream:
                writer = cls(stream)
                cls._registry[id(stream)] = writer
            return writer

    def write_line(self, text: str) -> None:
        data = text if text.endswith("\n") else text + "\n"
        with self.lock:
            if self._held is None:
                self.stream.write(data)
                self.stream.flush()
                return
            stream, descriptor = self._held
            encoded = data.encode(stream.encoding, stream.errors or "strict")
            stream.flush()  # what was written to the stream around this writer goes first
            written = descriptor.write(encoded)
            if written < len(encoded):
                stream.buffer.write(encoded[written:])
                stream.flush()


def _standard_descriptor(stream: TextIO) -> tuple[io.TextIOWrapper, HeldDescriptor] | None:
    """The stream and the descriptor :class:`LineWriter` writes its lines to itself: only the
    interpreter's standard output or error on POSIX (whose newline is written as it is) in
    UTF-8, where the bytes are those the stream would write, on a descriptor that takes held
    writes (:meth:`HeldDescriptor.open`); None for every other stream."""
    if not isinstance(stream, io.TextIOWrapper) or os.name != "posix":
        return None
    if stream is not sys.__stdout__ and stream is not sys.__stderr__:
        return None
    if codecs.lookup(stream.encoding).name != "utf-8":
        return None
    try:
        descriptor = HeldDescriptor.open(stream.fileno())
    except (OSError, ValueError):
        return None
    return None if descriptor is None else (stream, descriptor)


class LineWriterHandler(logging.Handler):
    """A logging handler that writes each formatted record as whole lines through a LineWriter.

    Put a ``RedactingLogFilter`` on it. Embedded newlines in a record are kept as one write, so a
    multi-line traceback still never splits a chained line.
    """

    def __init__(self, writer: LineWriter) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.write_line(self.format(record))
        except Exception:
            self.handleError(record)


class ChainedSink:
    """One chained, redacted stream. Thread-safe; see the module docstring for the format."""

    def __init__(
        self,
        out: TextIO | LineWriter,
        *,
        stream: str,
        schema: str,
        clock: Clock,
        journal_dir: str | os.PathLike[str] | None = None,
        checkpoint_lines: int = DEFAULT_CHECKPOINT_LINES,
        window_lines: int = DEFAULT_WINDOW_LINES,
        redactor: Redactor | None = None,
        on_redaction: Callable[[str, tuple[Leak, ...]], None] | None = None,
        routine_events: frozenset[str] = frozenset(),
        worker: int | None = None,
    ) -> None:
        if checkpoint_lines < 1:
            raise ValueError("checkpoint_lines must be at least 1")
        if window_lines < 1:
            raise ValueError("window_lines must be at least 1")
        if not stream.replace("-", "").replace("_", "").isalnum():
            raise ValueError("stream names are letters, digits, '-' and '_'")
        if worker is not None and (isinstance(worker, bool) or worker < 0):
            raise ValueError("worker is a non-negative index")
        self._writer = out if isinstance(out, LineWriter) else LineWriter.for_stream(out)
        self.worker = worker
        self.stream = stream
        self.schema = schema
        self._clock = clock
        self._checkpoint_lines = checkpoint_lines
        self._window: deque[tuple[int, str]] = deque(maxlen=window_lines)
        self._routine: deque[tuple[int, str]] = deque(maxlen=window_lines)
        self._routine_events = routine_events
        self._redactor = redactor
        self.on_redaction = on_redaction
        self._lock = threading.Lock()
        self._head: ChainHead | None = None
        self._persisted_seq: int | None = None
        # Head-file replacements and ``_persisted_seq`` (which only grows) are under this lock,
        # never ``_lock``: the checkpoint thread must not need ``_lock``, which a writer waiting
        # for that checkpoint holds.
        self._persist_lock = threading.Lock()
        self._persisted_clean = False
        self._early_lines = max(1, checkpoint_lines - checkpoint_lines // 4)
        self._checkpointer: ThreadPoolExecutor | None = None
        self._checkpoint: Future[None] | None = None
        self._checkpoint_failure: ChainError | None = None
        self._heads_failed = False
        self.on_failure: Callable[[], None] | None = None
        """Called (in the emitting thread, no lock held) after each line that finds the head
        unpersisted: a failed checkpoint, or a line refused at the bound (``plane.py`` halts)."""
        self._closed = False
        self._lines_written = 0
        self._lock_fd: int | None = None
        self._head_path: Path | None = None
        self.resumption: _Resumption | None = None
        if journal_dir is not None:
            self._open_journal(Path(journal_dir))

    # -- public API ---------------------------------------------------------------------------

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        """Write one chained line for ``event``; reserved names are a programming error."""
        if event in _RESERVED_EVENTS:
            raise ChainError(
                f"event {event} is written by the chain itself", code=Code.EVENT_RESERVED
            )
        given = dict(fields or {})
        clash = RESERVED_FIELDS.intersection(given)
        if clash:
            raise ChainError(
                f"fields {sorted(clash)} are written by the chain itself", code=Code.FIELD_RESERVED
            )
        try:
            self._write(event, given)
        finally:
            if self._heads_failed and self.on_failure is not None:
                self.on_failure()

    @property
    def failed(self) -> bool:
        """The last attempt to persist the head failed (a full disk), none has landed since."""
        return self._heads_failed

    def recover(self) -> bool:
        """A synced probe: persist the current head now (not clean); True when it landed (the
        heads take writes again, :attr:`failed` is false)."""
        try:
            self.checkpoint()
        except ChainError:
            return False
        return not self._heads_failed

    def head(self) -> ChainHead | None:
        with self._lock:
            return self._head

    def lines(self) -> list[str]:
        """The window, oldest first, without newlines: the last ``window_lines`` lines this
        process wrote of each kind (routine, and everything else)."""
        return list(self.snapshot().lines)

    def snapshot(self) -> ChainSnapshot:
        with self._lock:
            entries = sorted((*self._window, *self._routine))
            head = self._head
        elided: list[tuple[int, int]] = []
        for (before, _), (after, _) in itertools.pairwise(entries):
            if after > before + 1:
                elided.append((before + 1, after - 1))
        return ChainSnapshot(tuple(text for _, text in entries), head, tuple(elided))

    def checkpoint(self) -> None:
        """Persist the head now (not marked clean)."""
        with self._lock:
            self._persist(clean=False)

    def wait_checkpoint(self) -> None:
        """Return once the checkpoint running in the background (if any) has landed or failed."""
        pending = self._checkpoint
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Persist the head marked ``clean`` and release the journal; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.wait_checkpoint()
                if self._checkpointer is not None:
                    self._checkpointer.shutdown(wait=True)
                self._persist(clean=True)
            finally:
                if self._lock_fd is not None:
                    os.close(self._lock_fd)
                    self._lock_fd = None

    # -- writing ------------------------------------------------------------------------------

    def _write(self, event: str, fields: dict[str, Any], *, resumption: bool = False) -> None:
        clean_fields, found = clean_line(fields, self._redactor)
        leaks = [Leak(path, kind, secret) for path, kind, secret in found]
        trace_id = telemetry.current_trace_id()
        if trace_id is not None:
            # joins an incident bundle with its trace; absent while tracing is off, so the
            # lines are then what they always were (docs/tracing.md)
            clean_fields.setdefault("trace_id", trace_id)
        with self._lock:
            if self._closed:
                raise ChainError("the stream is closed", code=Code.CHAIN_CLOSED)
            seq, prev_hash = self._next_position()
            if (
                not resumption
                and self._head_path is not None
                and self._head is not None
                and self._beyond_bound(seq)
            ):
                # The checkpoint started early is still on the disk: wait for it. When it failed,
                # writing on unpersisted would break the bound a crash resumption relies on, so
                # persist first or refuse the line (raises).
                self.wait_checkpoint()
                if self._beyond_bound(seq):
                    self._persist(clean=False)
            if self.schema == SECURITY_SCHEMA:
                # every line on stderr carries a level (docs/evidence.md)
                clean_fields.setdefault("level", security_level(event))
            line: dict[str, Any] = {
                **clean_fields,
                "schema": self.schema,
                "seq": seq,
                "at": format_ms(self._clock.now()),
                "event": event,
                "prev_hash": prev_hash,
            }
            if self.worker is not None:
                line["worker"] = self.worker
            if self._head is None and self.resumption is None and not resumption:
                line["genesis"] = True
            text = _hashed_text(line)
            self._writer.write_line(text)
            (self._routine if event in self._routine_events else self._window).append((seq, text))
            self._head = ChainHead(self.stream, self.schema, seq, line["hash"])
            self._lines_written += 1
            failure: ChainError | None = None
            if self._head_path is not None:
                if self._persisted_seq is None or resumption:
                    try:
                        self._persist(clean=False)
                    except ChainError as exc:
                        failure = exc
                elif seq >= self._persisted_seq + self._early_lines and (
                    self._checkpoint is None or self._checkpoint.done()
                ):
                    failure, self._checkpoint_failure = self._checkpoint_failure, None
                    if self._checkpointer is None:
                        self._checkpointer = ThreadPoolExecutor(
                            max_workers=1, thread_name_prefix=f"agentsafe-chain-{self.stream}"
                        )
                    self._checkpoint = self._checkpointer.submit(
                        self._persist_in_background, self._head
                    )
        if failure is not None:
            _log.error("chain checkpoint failed for stream %s", self.stream, exc_info=failure)
        if leaks and self.on_redaction is not None:
            self.on_redaction(self.stream, tuple(leaks))

    def _beyond_bound(self, seq: int) -> bool:
        """True when writing line ``seq`` now would pass the persisted head's crash bound."""
        persisted = self._persisted_seq
        return persisted is None or seq > persisted + self._checkpoint_lines

    def _persist_in_background(self, head: ChainHead) -> None:
        """The checkpoint thread's job: persist ``head``; a failure is logged by the next line."""
        try:
            self._persist_head(head, clean=False)
        except ChainError as exc:
            self._checkpoint_failure = exc

    def _next_position(self) -> tuple[int, str]:
        if self._head is not None:
            return self._head.seq + 1, self._head.hash
        return 1, GENESIS_HASH

    # -- persistence --------------------------------------------------------------------------

    def _open_journal(self, journal_dir: Path) -> None:
        chain_dir = journal_dir / "chain"
        try:
            chain_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_fd = os.open(
                chain_dir / f"{self.stream}.lock", os.O_RDWR | os.O_CREAT, 0o600
            )
        except OSError as exc:
            raise ChainError(
                f"chain journal for stream {self.stream} cannot be opened", code=Code.CHAIN_JOURNAL
            ) from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise ChainError(
                f"chain journal for stream {self.stream} is held by another process",
                code=Code.CHAIN_JOURNAL_IN_USE,
            ) from exc
        self._head_path = chain_dir / f"{self.stream}.head.json"
        try:
            self._resume()
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise

    def _resume(self) -> None:
        stored = self._read_head()
        if stored is None:
            return
        head, clean, stored_interval = stored
        # After a crash the dead process may have written up to `stored_interval` lines past its
        # last checkpoint; continue strictly beyond them, so the gap is visible.
        seq = head.seq + 1 if clean else head.seq + stored_interval + 1
        self.resumption = _Resumption(resumed_from=head, gap=not clean, seq=seq)
        self._head = ChainHead(self.stream, self.schema, seq - 1, head.hash)
        self._write(
            CHAIN_RESUMED,
            {
                "resumed_from": {"seq": head.seq, "hash": head.hash},
                "gap": not clean,
                "checkpoint_lines": self._checkpoint_lines,
            },
            resumption=True,
        )
        if self._persisted_seq != seq:
            raise ChainError(
                f"chain head for stream {self.stream} could not be persisted",
                code=Code.CHAIN_JOURNAL,
            )

    def _read_head(self) -> tuple[ChainHead, bool, int] | None:
        assert self._head_path is not None
        try:
            raw = self._head_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ChainError(
                f"chain head for stream {self.stream} cannot be read",
                code=Code.CHAIN_HEAD_UNREADABLE,
            ) from exc
        try:
            data = json.loads(raw)
            head = ChainHead(self.stream, self.schema, data["seq"], data["hash"])
            clean = data["clean"]
            interval = data["checkpoint_lines"]
            valid = (
                data.get("schema") == HEAD_SCHEMA
                and data.get("stream") == self.stream
                and data.get("stream_schema") == self.schema
                and isinstance(head.seq, int)
                and not isinstance(head.seq, bool)
                and head.seq >= 1
                and isinstance(head.hash, str)
                and head.hash.startswith("sha256:")
                and isinstance(clean, bool)
                and isinstance(interval, int)
                and not isinstance(interval, bool)
                and interval >= 1
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ChainError(
                f"chain head for stream {self.stream} is unreadable",
                code=Code.CHAIN_HEAD_UNREADABLE,
            ) from exc
        if not valid:
            raise ChainError(
                f"chain head for stream {self.stream} is unreadable",
                code=Code.CHAIN_HEAD_UNREADABLE,
            )
        return head, clean, interval

    def _persist(self, *, clean: bool) -> None:
        """Persist the current head now. ``_lock`` held."""
        if self._head is not None:
            self._persist_head(self._head, clean=clean)

    def _persist_head(self, head: ChainHead, *, clean: bool) -> None:
        """Atomically replace the head file (temp, fsync, rename, fsync dir) with ``head``,
        unless it already holds a newer one (or this one, clean)."""
        if self._head_path is None:
            return
        with self._persist_lock:
            persisted = self._persisted_seq
            if persisted is not None and (
                head.seq < persisted
                or (head.seq == persisted and self._persisted_clean and not clean)
            ):
                return
            try:
                self._replace_head_file(head, clean=clean)
            except ChainError:
                self._heads_failed = True
                raise
            self._heads_failed = False
            self._persisted_seq = head.seq
            self._persisted_clean = clean

    def _replace_head_file(self, head: ChainHead, *, clean: bool) -> None:
        assert self._head_path is not None
        record = {
            "schema": HEAD_SCHEMA,
            "stream": self.stream,
            "stream_schema": self.schema,
            "seq": head.seq,
            "hash": head.hash,
            "clean": clean,
            "checkpoint_lines": self._checkpoint_lines,
            "at": format_ms(self._clock.now()),
        }
        data = (canonical_text(record) + "\n").encode("utf-8")
        tmp = self._head_path.with_name(self._head_path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._head_path)
            fsync_directory(self._head_path.parent)
        except OSError as exc:
            raise ChainError(
                f"chain head for stream {self.stream} could not be persisted",
                code=Code.CHAIN_JOURNAL,
            ) from exc


# A per-process value no caller can know in advance, written where the hash will go.
_HASH_PLACEHOLDER = "sha256:" + secrets.token_hex(32)
_PLACEHOLDER_MEMBER = f'"hash":"{_HASH_PLACEHOLDER}",'


def _hashed_text(line: dict[str, Any]) -> str:
    """Set ``line["hash"]`` to ``sha256_digest`` of the line without it; the line's canonical
    text with it. One canonicalisation instead of two.

    The line is canonicalised once with the placeholder as its hash. ``hash`` is never the
    first or last key (``at`` sorts before it, ``seq`` after), so the text without it is the
    draft less the member ``"hash":"<placeholder>",``; the written text is the draft with the
    digest in the placeholder's place. That holds only if the placeholder occurs once (at the
    top level, where it always is): otherwise, and whenever the member is not where expected,
    the line takes the two canonicalisations. ``tests/evidence/test_chain.py`` holds this to
    them with hypothesis."""
    line["hash"] = _HASH_PLACEHOLDER
    draft = canonical_text(line)
    if draft.count(_HASH_PLACEHOLDER) == 1 and _PLACEHOLDER_MEMBER in draft:
        unhashed = draft.replace(_PLACEHOLDER_MEMBER, "", 1)
        digest = "sha256:" + sha256_hex(unhashed.encode("utf-8"))
        line["hash"] = digest
        return draft.replace(_HASH_PLACEHOLDER, digest, 1)
    del line["hash"]
    line["hash"] = sha256_digest(line)
    return canonical_text(line)


@dataclass
class ChainedStreams:
    """The two chained sinks of a process, wired so redactions raise ``LEAK_SUSPECTED``."""

    evidence: ChainedSink
    security: ChainedSink

    def __post_init__(self) -> None:
        self._reporting = threading.local()

    @property
    def streams(self) -> Streams:
        return Streams(evidence=self.evidence, security=self.security)

    def sinks(self) -> dict[str, ChainedSink]:
        return {"evidence": self.evidence, "security": self.security}

    def heads(self) -> dict[str, ChainHead | None]:
        return {name: sink.head() for name, sink in self.sinks().items()}

    @property
    def failed(self) -> bool:
        """A stream's head could not be persisted, and has not been since."""
        return self.evidence.failed or self.security.failed

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after each line a stream writes (or refuses) with its head
        unpersisted (``plane.py``: the halt, cause ``CHAIN_HEADS``)."""
        self.evidence.on_failure = callback
        self.security.on_failure = callback

    def recover(self) -> bool:
        """Persist both heads now (a synced write each); True when both landed."""
        evidence = self.evidence.recover()
        security = self.security.recover()
        return evidence and security

    def report_leaks(self, stream: str, leaks: tuple[Leak, ...]) -> None:
        """Raise LEAK_SUSPECTED on the security stream, once per leak; never recursive."""
        if getattr(self._reporting, "active", False):
            return
        self._reporting.active = True
        try:
            for leak in dict.fromkeys(leaks):
                fields: dict[str, Any] = {"stream": stream, "field": leak.field, "kind": leak.kind}
                if leak.secret is not None:
                    fields["secret_name"] = leak.secret
                self.security.emit(LEAK_SUSPECTED, fields)
        finally:
            self._reporting.active = False

    def report_log_redactions(self, found: tuple[Redaction, ...]) -> None:
        """The ``on_redaction`` callback for ``RedactingLogFilter``."""
        self.report_leaks("log", tuple(Leak("message", f.kind, f.secret) for f in found))

    def close(self) -> None:
        try:
            self.evidence.close()
        finally:
            self.security.close()


def open_chained_streams(
    *,
    evidence_out: TextIO | LineWriter,
    security_out: TextIO | LineWriter,
    clock: Clock,
    journal_dir: str | os.PathLike[str] | None = None,
    checkpoint_lines: int = DEFAULT_CHECKPOINT_LINES,
    window_lines: int = DEFAULT_WINDOW_LINES,
    redactor: Redactor | None = None,
    routine_security_events: frozenset[str] = frozenset(),
    worker: int | None = None,
) -> ChainedStreams:
    """Open (or resume) both streams; the security stream also records evidence's resumption.

    ``routine_security_events`` are the security lines anyone who reaches the listener can
    cause (the door's refusals): in the window they only ever push out each other."""
    security = ChainedSink(
        security_out,
        stream="security",
        schema=SECURITY_SCHEMA,
        clock=clock,
        journal_dir=journal_dir,
        checkpoint_lines=checkpoint_lines,
        window_lines=window_lines,
        redactor=redactor,
        routine_events=routine_security_events,
        worker=worker,
    )
    try:
        evidence = ChainedSink(
            evidence_out,
            stream="evidence",
            schema=EVIDENCE_SCHEMA,
            clock=clock,
            journal_dir=journal_dir,
            checkpoint_lines=checkpoint_lines,
            window_lines=window_lines,
            redactor=redactor,
            worker=worker,
        )
    except BaseException:
        with contextlib.suppress(ChainError):
            security.close()
        raise
    streams = ChainedStreams(evidence=evidence, security=security)
    evidence.on_redaction = streams.report_leaks
    security.on_redaction = streams.report_leaks
    if evidence.resumption is not None:
        r = evidence.resumption
        security._write(  # a record *about* another stream: not a resumption of this one
            CHAIN_RESUMED,
            {
                "stream": "evidence",
                "resumption": {
                    "seq": r.seq,
                    "gap": r.gap,
                    "from_seq": r.resumed_from.seq,
                    "from_hash": r.resumed_from.hash,
                },
            },
        )
    return streams
