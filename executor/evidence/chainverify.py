"""The offline chain verifier: ``verify_chain(lines)`` and ``agentsafe verify chain <file>``.

It needs nothing from the running process: it recomputes each line's hash (RFC 8785 canonical
JSON without ``hash``), follows ``prev_hash`` links and ``seq`` increments, and classifies the
first break it meets. Lines of both schemas may share a file; each schema is walked on its own.
Under ``EXECUTOR_WORKERS`` above 1 a collected log interleaves the chains of several workers:
every line names its ``worker``, and each (schema, worker) pair is walked as its own chain
(:func:`chain_key` names it in :attr:`ChainReport.streams`). A torn fragment whose worker cannot
be read belongs to the chain of the line before it, as its schema does.
Lines that are not ours (other logs) are listed as foreign and otherwise ignored: a chain line
that went missing among them is still found by its ``seq``/``prev_hash``.

Findings that are tampering (the report is not ``ok``): ALTERED, REMOVED, INSERTED, REORDERED,
DUPLICATE, TRUNCATED_MIDDLE, MALFORMED. Findings that are not: RESUMPTION_GAP (a restart after a
crash, announced by a ``CHAIN_RESUMED`` line with ``gap: true``), TRUNCATED_TAIL (a torn last
line), CHAIN_RESTARTED (a new genesis, as after a restart without a journal directory), ELIDED
(a range the caller declared left out, as a bundle's manifest does for its window).

Callers: ``cli.py`` (``agentsafe verify chain``), ``evidence/bundle.py`` (``verify_bundle``),
tests.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..canonical import canonical_text, parse_json, sha256_digest
from ..errors import CanonicalizationError
from ..events import EVIDENCE_SCHEMA, GENESIS_HASH, LOG_SCHEMA, SECURITY_SCHEMA

__all__ = [
    "ALTERED",
    "CHAIN_RESTARTED",
    "DUPLICATE",
    "ELIDED",
    "INSERTED",
    "MALFORMED",
    "REMOVED",
    "REORDERED",
    "RESUMPTION_GAP",
    "TAMPERING_KINDS",
    "TRUNCATED_MIDDLE",
    "TRUNCATED_TAIL",
    "ChainFinding",
    "ChainReport",
    "StreamSummary",
    "chain_key",
    "main",
    "verify_chain",
    "verify_chain_file",
]

KNOWN_SCHEMAS = (EVIDENCE_SCHEMA, SECURITY_SCHEMA)

ALTERED = "ALTERED"
REMOVED = "REMOVED"
INSERTED = "INSERTED"
REORDERED = "REORDERED"
DUPLICATE = "DUPLICATE"
TRUNCATED_MIDDLE = "TRUNCATED_MIDDLE"
TRUNCATED_TAIL = "TRUNCATED_TAIL"
MALFORMED = "MALFORMED"
RESUMPTION_GAP = "RESUMPTION_GAP"
ELIDED = "ELIDED"
CHAIN_RESTARTED = "CHAIN_RESTARTED"

TAMPERING_KINDS = frozenset(
    {ALTERED, REMOVED, INSERTED, REORDERED, DUPLICATE, TRUNCATED_MIDDLE, MALFORMED}
)


@dataclass(frozen=True)
class ChainFinding:
    """One thing the walk found. ``seq`` is where the chain breaks; ``line`` is 1-based."""

    kind: str
    schema: str | None
    seq: int | None
    line: int
    detail: str
    worker: int | None = None

    @property
    def tampering(self) -> bool:
        return self.kind in TAMPERING_KINDS

    def describe(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "unknown seq"
        stream = self.schema or "unknown stream"
        if self.worker is not None:
            stream = f"{stream}, worker {self.worker}"
        return f"{self.kind} at {where} (line {self.line}, {stream})"


def chain_key(schema: str, worker: int | None) -> str:
    """How :attr:`ChainReport.streams` names a chain: its schema, and its worker if any."""
    return schema if worker is None else f"{schema}@worker-{worker}"


@dataclass(frozen=True)
class StreamSummary:
    """What the walk saw of one schema; ``last_*`` is the last chain line in file order."""

    schema: str
    lines: int
    first_seq: int | None
    last_seq: int | None
    last_hash: str | None
    resumptions: int
    worker: int | None = None


@dataclass(frozen=True)
class ChainReport:
    findings: tuple[ChainFinding, ...]
    streams: dict[str, StreamSummary]
    foreign_lines: tuple[int, ...]
    total_lines: int

    @property
    def ok(self) -> bool:
        """No tampering found (gaps, a torn tail and restarts are allowed and listed)."""
        return not any(f.tampering for f in self.findings)

    @property
    def first_bad(self) -> ChainFinding | None:
        return next((f for f in self.findings if f.tampering), None)

    @property
    def gaps(self) -> tuple[ChainFinding, ...]:
        return tuple(f for f in self.findings if f.kind == RESUMPTION_GAP)


@dataclass
class _Item:
    line: int
    raw: str
    obj: dict[str, Any] | None  # None: an unparsable fragment of a chain line
    schema: str | None
    problem: str | None = None  # set when the line is structurally unusable
    consistent: bool = False  # parsed, well formed, canonical, and its hash matches
    worker: int | None = None
    worker_known: bool = True


@dataclass
class _Frontier:
    seq: int
    hash: str | None  # None after an unusable line: the next link cannot be checked


@dataclass
class _Walk:
    schema: str
    items: list[_Item]
    last_line: int
    require_genesis: bool
    elided: frozenset[tuple[int, int]] = frozenset()
    findings: list[ChainFinding] = field(default_factory=list)
    resumptions: int = 0
    worker: int | None = None

    def add(self, kind: str, seq: int | None, item: _Item, detail: str) -> None:
        self.findings.append(ChainFinding(kind, self.schema, seq, item.line, detail, self.worker))


def verify_chain(
    lines: Iterable[str],
    *,
    require_genesis: bool = False,
    elided: Iterable[tuple[int, int]] = (),
) -> ChainReport:
    """Walk every chain in ``lines`` (text lines, with or without trailing newlines).

    ``require_genesis`` demands that each schema's first line is a genesis line, so a log that
    should start at the process's first line cannot silently lose its head. ``elided`` names
    inclusive ``(first, last)`` sequence ranges the lines are declared to leave out (a bundle's
    window, whose manifest declares them): a break that is exactly such a range is ELIDED, not
    REMOVED; any other break is still what it is.
    """
    declared = frozenset((int(a), int(b)) for a, b in elided)
    items: list[_Item] = []
    foreign: list[int] = []
    last_schema: str | None = None
    last_worker: int | None = None
    total = 0
    for number, raw_line in enumerate(lines, start=1):
        total = number
        raw = raw_line.rstrip("\r\n")
        if not raw.strip():
            continue
        item = _classify(number, raw)
        if item is None:
            foreign.append(number)
            continue
        if item.schema is None:
            item.schema = last_schema
        else:
            last_schema = item.schema
        if item.worker_known:
            last_worker = item.worker
        else:
            item.worker = last_worker
        items.append(item)
    # A fragment whose stream could not be told belongs to the stream that follows it, or else
    # to the only stream present.
    first_known = next((i.schema for i in items if i.schema is not None), EVIDENCE_SCHEMA)
    for item in items:
        if item.schema is None:
            item.schema = first_known
    last_line = max((i.line for i in items), default=0)
    findings: list[ChainFinding] = []
    summaries: dict[str, StreamSummary] = {}
    chains = list(dict.fromkeys((i.schema, i.worker) for i in items if i.schema is not None))
    for schema, worker in chains:
        assert schema is not None
        walk = _Walk(
            schema,
            [i for i in items if i.schema == schema and i.worker == worker],
            last_line,
            require_genesis,
            declared,
            worker=worker,
        )
        _walk(walk)
        findings.extend(walk.findings)
        summaries[chain_key(schema, worker)] = _summarise(walk)
    findings.sort(key=lambda f: f.line)
    return ChainReport(tuple(findings), summaries, tuple(foreign), total)


_LOG_PREFIX = '{"schema":"' + LOG_SCHEMA + '"'


def _classify(number: int, raw: str) -> _Item | None:
    try:
        obj = parse_json(raw)
    except (ValueError, CanonicalizationError, RecursionError):
        if _looks_like_chain(raw):
            schema = next((s for s in KNOWN_SCHEMAS if s in raw), None)
            found = _WORKER_FIELD.search(raw)
            return _Item(
                number,
                raw,
                None,
                schema,
                "unparsable",
                worker=int(found.group(1)) if found else None,
                worker_known=found is not None,
            )
        return None
    if not isinstance(obj, dict):
        return None
    schema = obj.get("schema")
    known = schema if schema in KNOWN_SCHEMAS else None
    if known is None and "prev_hash" not in obj and "hash" not in obj:
        return None
    worker = obj.get("worker")
    if not isinstance(worker, int) or isinstance(worker, bool) or worker < 0:
        worker = None  # absent (one process); anything else fails the line's hash or structure
    return _Item(number, raw, obj, known, worker=worker)


_WORKER_FIELD = re.compile(r'"worker":(\d{1,6})[,}]')


def _looks_like_chain(raw: str) -> bool:
    # Keys are written sorted, so a torn line may hold none of ours; any torn JSON object
    # counts, but an operational log line (events.JsonLogFormatter, which writes its schema
    # first where a chain line, canonical, starts with "at") is foreign even torn.
    if raw.lstrip().startswith(_LOG_PREFIX):
        return False
    return (
        raw.lstrip().startswith("{")
        or '"prev_hash":' in raw
        or any(schema in raw for schema in KNOWN_SCHEMAS)
    )


def _structure_problem(obj: dict[str, Any]) -> str | None:
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return "seq is not a positive integer"
    for name in ("hash", "prev_hash"):
        value = obj.get(name)
        if not isinstance(value, str) or not value.startswith("sha256:") or len(value) != 71:
            return f"{name} is not a sha256 digest"
    if not isinstance(obj.get("event"), str):
        return "event is not a string"
    if not isinstance(obj.get("at"), str):
        return "at is not a string"
    return None


def _is_resumption(obj: dict[str, Any]) -> bool:
    return obj.get("event") == "CHAIN_RESUMED" and isinstance(obj.get("resumed_from"), dict)


def _is_genesis(obj: dict[str, Any]) -> bool:
    return obj.get("genesis") is True and obj.get("prev_hash") == GENESIS_HASH


def _self_consistent(item: _Item) -> bool:
    assert item.obj is not None
    body = {k: v for k, v in item.obj.items() if k != "hash"}
    try:
        return sha256_digest(body) == item.obj["hash"] and canonical_text(item.obj) == item.raw
    except CanonicalizationError:
        return False


def _walk(walk: _Walk) -> None:
    items = walk.items
    frontier: _Frontier | None = None
    seen: dict[int, str] = {}
    late_ok: set[int] = set()

    for item in items:
        if item.obj is not None and item.problem is None:
            item.problem = _structure_problem(item.obj)
        item.consistent = item.problem is None and _self_consistent(item)

    def later(index: int) -> list[_Item]:
        """The sound lines after ``index``: what lookahead may trust."""
        return [i for i in items[index + 1 :] if i.consistent]

    for index, item in enumerate(items):
        expected = frontier.seq + 1 if frontier is not None else None
        if expected is None:
            following = later(index)
            guess = following[0].obj["seq"] - 1 if following and following[0].obj else None
        else:
            guess = expected
        if item.obj is None or item.problem is not None:
            if item.obj is None and item.line == walk.last_line and not item.raw.endswith("}"):
                walk.add(TRUNCATED_TAIL, guess, item, "the last line is torn")
            elif item.obj is None:
                walk.add(TRUNCATED_MIDDLE, guess, item, "a line before the end is not JSON")
            else:
                walk.add(MALFORMED, guess, item, item.problem or "malformed")
            if guess is not None:
                frontier = _Frontier(guess, None)
            continue
        obj = item.obj
        seq: int = obj["seq"]
        line_hash: str = obj["hash"]
        prev_hash: str = obj["prev_hash"]
        if not item.consistent:
            if _is_genesis(obj) and frontier is None:
                at = 1
            elif expected is not None and not _is_resumption(obj):
                at = expected
            else:
                at = guess if guess is not None else seq
            walk.add(ALTERED, at, item, "the line's content does not match its hash")
            frontier = _Frontier(at, line_hash)
            seen[at] = line_hash
            continue
        if frontier is None:
            following = later(index)
            if any(i.obj is not None and i.obj["hash"] == line_hash for i in following):
                walk.add(DUPLICATE, seq, item, "a copy of a line that appears again later")
                continue
            earlier = [i.obj["seq"] for i in following if i.obj is not None and i.obj["seq"] < seq]
            if earlier:
                first = min(earlier)
                walk.add(REORDERED, first, item, f"seq {seq} appears before seq {first}")
                late_ok.update(range(first, seq))
            elif walk.require_genesis and not _is_genesis(obj):
                walk.add(REMOVED, 1, item, "the log does not start at the chain's genesis")
            if _is_resumption(obj):
                walk.resumptions += 1
            seen[seq] = line_hash
            frontier = _Frontier(seq, line_hash)
            continue
        if _is_genesis(obj) and seq == 1:
            walk.add(CHAIN_RESTARTED, 1, item, "a new chain starts here (a fresh genesis)")
            seen = {1: line_hash}
            late_ok.clear()
            frontier = _Frontier(1, line_hash)
            continue
        if (
            _is_resumption(obj)
            and seq > frontier.seq
            and _check_resumption(walk, item, frontier, seen)
        ):
            seen[seq] = line_hash
            frontier = _Frontier(seq, line_hash)
            continue
        if seq == frontier.seq + 1:
            if frontier.hash is None or prev_hash == frontier.hash:
                seen[seq] = line_hash
                frontier = _Frontier(seq, line_hash)
                continue
            following = later(index)
            if (
                following
                and following[0].obj is not None
                and following[0].obj["seq"] == seq
                and following[0].obj["prev_hash"] == frontier.hash
            ):
                walk.add(INSERTED, seq, item, "a line that is not part of the chain")
                continue
            walk.add(
                ALTERED,
                frontier.seq,
                item,
                f"line seq {seq} records a different hash for seq {frontier.seq}",
            )
            seen[seq] = line_hash
            frontier = _Frontier(seq, line_hash)
            continue
        if seq > frontier.seq + 1:
            missing = frontier.seq + 1
            following = later(index)
            if any(i.obj is not None and i.obj["hash"] == line_hash for i in following):
                walk.add(DUPLICATE, seq, item, "a copy of a line that appears again later")
                continue
            if any(i.obj is not None and i.obj["seq"] == missing for i in following):
                walk.add(REORDERED, missing, item, f"seq {seq} appears before seq {missing}")
                late_ok.update(range(missing, seq))
            elif (missing, seq - 1) in walk.elided:
                walk.add(ELIDED, missing, item, f"seq {missing}..{seq - 1} left out, as declared")
            else:
                walk.add(
                    REMOVED, missing, item, f"seq {missing}..{seq - 1} missing before seq {seq}"
                )
            seen[seq] = line_hash
            frontier = _Frontier(seq, line_hash)
            continue
        # seq <= frontier.seq
        if seen.get(seq) == line_hash:
            walk.add(DUPLICATE, seq, item, "a line that already appeared")
            continue
        if seq in seen:
            walk.add(INSERTED, seq, item, f"two different lines claim seq {seq}")
            if seq == frontier.seq and prev_hash == seen.get(seq - 1):
                # Keep following the line its successors link to.
                seen[seq] = line_hash
                frontier = _Frontier(seq, line_hash)
            continue
        if seq in late_ok:
            late_ok.discard(seq)
            seen[seq] = line_hash
            continue
        walk.add(REORDERED, seq, item, f"seq {seq} appears after seq {frontier.seq}")


def _check_resumption(walk: _Walk, item: _Item, frontier: _Frontier, seen: dict[int, str]) -> bool:
    """Accept a CHAIN_RESUMED line that legitimately explains a break; False to classify it."""
    assert item.obj is not None
    obj = item.obj
    resumed = obj["resumed_from"]
    from_seq = resumed.get("seq")
    from_hash = resumed.get("hash")
    if (
        not isinstance(from_seq, int)
        or isinstance(from_seq, bool)
        or not isinstance(from_hash, str)
    ):
        return False
    if obj["prev_hash"] != from_hash:
        return False
    if from_seq > frontier.seq:
        # The resumed process had checkpointed lines this log does not hold.
        walk.add(
            REMOVED,
            frontier.seq + 1,
            item,
            f"the resumption names checkpoint seq {from_seq}, beyond seq {frontier.seq} here",
        )
        return True
    if from_seq in seen and seen[from_seq] != from_hash:
        walk.add(ALTERED, from_seq, item, "the resumption names a head this log does not hold")
        return True
    if obj.get("gap") is True:
        walk.resumptions += 1
        walk.add(
            RESUMPTION_GAP,
            obj["seq"],
            item,
            f"restart after a crash: resumed from checkpoint seq {from_seq}; lines after seq "
            f"{frontier.seq} and before seq {obj['seq']} were never written or are not provable",
        )
        return True
    # A clean resumption must continue exactly at the last line.
    if from_seq == frontier.seq and obj["seq"] == frontier.seq + 1:
        walk.resumptions += 1
        return True
    return False


def _summarise(walk: _Walk) -> StreamSummary:
    valid = [i.obj for i in walk.items if i.obj is not None and i.problem is None]
    last = walk.items[-1].obj if walk.items and walk.items[-1].problem is None else None
    return StreamSummary(
        worker=walk.worker,
        schema=walk.schema,
        lines=len(walk.items),
        first_seq=valid[0]["seq"] if valid else None,
        last_seq=last["seq"] if last else None,
        last_hash=last["hash"] if last else None,
        resumptions=walk.resumptions,
    )


def verify_chain_file(path: str | Path, *, require_genesis: bool = False) -> ChainReport:
    """Read ``path`` as bytes; bytes that are not UTF-8 become U+FFFD (and so fail the hash)."""
    data = Path(path).read_bytes()
    return verify_chain(
        (chunk.decode("utf-8", errors="replace") for chunk in data.split(b"\n")),
        require_genesis=require_genesis,
    )


def format_report(report: ChainReport) -> str:
    out: list[str] = []
    bad = report.first_bad
    if bad is not None:
        out.append(f"BROKEN: first bad {bad.describe()}: {bad.detail}")
    elif not report.streams:
        out.append("NO CHAIN: no chained lines found")
    else:
        out.append("INTACT")
    for key, summary in report.streams.items():
        out.append(
            f"  {key}: {summary.lines} lines, "
            f"seq {summary.first_seq}..{summary.last_seq}, {summary.resumptions} resumption(s)"
        )
    for finding in report.findings:
        if finding is not bad:
            out.append(f"  {finding.describe()}: {finding.detail}")
    if report.foreign_lines:
        out.append(f"  {len(report.foreign_lines)} foreign line(s) not part of any chain")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``agentsafe verify chain [--require-genesis] <file>``: 0 intact, 1 broken, 2 usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    require_genesis = "--require-genesis" in args
    paths = [a for a in args if a != "--require-genesis"]
    if len(paths) != 1 or paths[0].startswith("-"):
        print("usage: agentsafe verify chain [--require-genesis] <file>", file=sys.stderr)
        return 2
    try:
        report = verify_chain_file(paths[0], require_genesis=require_genesis)
    except OSError as exc:
        print(f"cannot read {paths[0]}: {exc.strerror or 'error'}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0 if report.ok and report.streams else 1
