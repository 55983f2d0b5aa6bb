"""The independent checker: the provider's record and every answer, five properties, PASS or FAIL.

Role: judge a chaos run from the outside. It imports nothing of agentsafe (the standard library
only) and runs the offline chain verifier (``agentsafe verify chain``) as a subprocess; it reads a
history directory:

* ``history.json``: the seed, the schedule, when the faults healed (``healed_at``, epoch
  seconds), the liveness bound in seconds, and the evidence chain files of the replicas;
* ``provider-record.jsonl``: the synthetic provider's durable record, one ``received`` line per
  payout request (the idempotency key, the grant id header, ``first``) and ``answered`` lines;
* ``answers.jsonl``: every answer a client got (or the error it met), one line per request.

Properties (each PASS or FAIL, with counts and the offending keys):

``at-most-once``
    no key reaches the provider more than once (``received`` lines per key);
``no-false-not-executed``
    no answer says not-executed (outcome FAILED_BEFORE_DISPATCH, DEFINITELY_NOT_EXECUTED, BLOCKED,
    ``executed: false``, or a 4xx refusal) for a key the provider acted on under the grant that
    answer names, or had acted on by the time the answer was given. A not-executed answer that
    the key's later retry overtook (nothing had been sent for it; the retry ran once) is true;
``completed-matches-one-execution``
    every COMPLETED answer's key was acted on by the provider exactly once, under the grant the
    answer names;
``final-answer-within-bound``
    every key a client sent has a final answer (a settled outcome, or a 4xx refusal) no later
    than ``bound_seconds`` after the faults healed (or after it was first sent, if later). A key
    whose answers after the faults all came from replicas halted for lost writes waits for an
    operator by design: an answer names STORE_LOST_WRITES, or every answer after the heal came
    from replicas whose own security stream said HALTED with cause STORE_LOST_WRITES by the end
    of the run (``halted_for_lost_writes`` in the history), the last of them a 503
    EXECUTOR_HALTED (a replica finds its lost writes only when it next reaches the store, and
    may answer 503 until then). Such a key is listed in the note as exempt, never counted as
    passing;
``evidence-verifies-offline``
    every chain file verifies (``agentsafe verify chain`` exits 0) and every grant the provider
    acted on appears in a DISPATCH line of one of them (NOT CHECKED when the history has no
    chain files, as a saved fixture).

Callers: ``chaos/run.py`` (after a run), ``python -m chaos check DIR``,
``e2e/test_chaos_checker.py``.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FINAL_OUTCOMES",
    "NOT_EXECUTED_OUTCOMES",
    "PROPERTIES",
    "History",
    "PropertyResult",
    "check",
    "format_report",
    "is_final",
    "load_history",
]

NOT_EXECUTED_OUTCOMES = frozenset({"FAILED_BEFORE_DISPATCH", "DEFINITELY_NOT_EXECUTED", "BLOCKED"})
FINAL_OUTCOMES = NOT_EXECUTED_OUTCOMES | {"COMPLETED"}
#: 4xx answers that are not a decision about the key: the client must retry.
_RETRY_STATUSES = frozenset({408, 409, 425, 429})

PROPERTIES = (
    "at-most-once",
    "no-false-not-executed",
    "completed-matches-one-execution",
    "final-answer-within-bound",
    "evidence-verifies-offline",
)


@dataclass
class History:
    meta: dict[str, Any]
    record: list[dict[str, Any]]
    answers: list[dict[str, Any]]
    root: Path | None = None


@dataclass
class PropertyResult:
    name: str
    status: str  # PASS, FAIL, NOT CHECKED
    checked: int
    offending: dict[str, str] = field(default_factory=dict)
    note: str = ""


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed writer
        if isinstance(value, dict):
            out.append(value)
    return out


def load_history(directory: Path) -> History:
    meta = json.loads((directory / "history.json").read_text(encoding="utf-8"))
    return History(
        meta=meta,
        record=_lines(directory / "provider-record.jsonl"),
        answers=_lines(directory / "answers.jsonl"),
        root=directory,
    )


def _not_executed(answer: Mapping[str, Any]) -> bool:
    status = answer.get("status")
    if status == 200:
        return answer.get("outcome") in NOT_EXECUTED_OUTCOMES or answer.get("executed") is False
    return isinstance(status, int) and 400 <= status < 500 and status not in _RETRY_STATUSES


def is_final(answer: Mapping[str, Any]) -> bool:
    """A settled answer: the client may stop retrying."""
    status = answer.get("status")
    if status == 200:
        return answer.get("outcome") in FINAL_OUTCOMES
    return isinstance(status, int) and 400 <= status < 500 and status not in _RETRY_STATUSES


def _received(record: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    by_key: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for line in record:
        if line.get("event") == "received" and isinstance(line.get("key"), str):
            by_key[str(line["key"])].append(line)
    return by_key


def _acted(lines: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The requests the synthetic provider acted on: a key's first request in an acting mode."""
    return [
        line
        for line in lines
        if line.get("first") and line.get("mode") in ("normal", "hang", "reset", "hold")
    ]


def check_at_most_once(history: History) -> PropertyResult:
    received = _received(history.record)
    offending = {
        key: f"{len(lines)} POSTs (grants {', '.join(str(x.get('grant_id')) for x in lines)})"
        for key, lines in sorted(received.items())
        if len(lines) > 1
    }
    return PropertyResult("at-most-once", "FAIL" if offending else "PASS", len(received), offending)


def check_no_false_not_executed(history: History) -> PropertyResult:
    acted = {key: _acted(lines) for key, lines in _received(history.record).items()}
    offending: dict[str, str] = {}
    checked = 0
    for answer in history.answers:
        key = str(answer.get("key"))
        if not _not_executed(answer):
            continue
        checked += 1
        grant, answered_at = answer.get("grant_id"), answer.get("at")
        contradicted = [
            line
            for line in acted.get(key, [])
            if (grant is not None and line.get("grant_id") == grant)
            or not isinstance(answered_at, int | float)
            or float(line.get("at", 0.0)) <= float(answered_at)
        ]
        if contradicted and key not in offending:
            what = answer.get("outcome") or answer.get("code") or answer.get("status")
            offending[key] = f"answered {what} by {answer.get('replica')} but the provider acted"
    return PropertyResult(
        "no-false-not-executed", "FAIL" if offending else "PASS", checked, offending
    )


def check_completed_matches(history: History) -> PropertyResult:
    received = _received(history.record)
    offending: dict[str, str] = {}
    checked = 0
    for answer in history.answers:
        if answer.get("status") != 200 or answer.get("outcome") != "COMPLETED":
            continue
        checked += 1
        key = str(answer.get("key"))
        acted = _acted(received.get(key, []))
        if len(acted) != 1 or len(received.get(key, [])) != 1:
            offending.setdefault(
                key, f"COMPLETED but {len(received.get(key, []))} provider requests"
            )
            continue
        grant = answer.get("grant_id")
        if grant is not None and grant != acted[0].get("grant_id"):
            offending.setdefault(key, "COMPLETED under another grant than the one the provider saw")
    return PropertyResult(
        "completed-matches-one-execution", "FAIL" if offending else "PASS", checked, offending
    )


def check_final_answer(history: History) -> PropertyResult:
    bound = float(history.meta.get("bound_seconds", 0))
    healed_at = float(history.meta.get("healed_at") or 0)
    first_sent: dict[str, float] = {}
    final_at: dict[str, float] = {}
    halted: set[str] = set()
    # Replicas that halted for lost writes (their own security lines, read by the harness at the
    # end of the run) stay halted until an operator resumes them. A replica finds its lost
    # writes only when it next reaches the store, which can be after the heal, and may answer
    # 503 until then. So a key waits for that operator by design when every answer after the
    # heal came from such replicas and the last was a halt.
    lost_writes_replicas = set(history.meta.get("halted_for_lost_writes") or ())
    only_halted: dict[str, bool] = {}
    last_halted: dict[str, bool] = {}
    for answer in sorted(history.answers, key=lambda a: float(a.get("sent") or 0)):
        key = str(answer.get("key"))
        if answer.get("lost_writes"):
            halted.add(key)
        if float(answer.get("sent") or 0) >= healed_at > 0:
            from_halted = answer.get("replica") in lost_writes_replicas
            only_halted[key] = only_halted.get(key, True) and from_halted
            last_halted[key] = (
                from_halted
                and answer.get("status") == 503
                and "EXECUTOR_HALTED" in (answer.get("reason_codes") or [answer.get("code")])
            )
        sent = float(answer.get("sent") or 0)
        first_sent[key] = min(first_sent.get(key, sent), sent)
        if is_final(answer):
            at = float(answer.get("at") or 0)
            final_at[key] = min(final_at.get(key, at), at)
    only_halted = {key: met and last_halted[key] for key, met in only_halted.items()}
    offending: dict[str, str] = {}
    exempt: list[str] = []
    for key, sent in sorted(first_sent.items()):
        deadline = max(sent, healed_at) + bound
        if key not in final_at and (key in halted or only_halted.get(key, False)):
            exempt.append(key)
        elif key not in final_at:
            offending[key] = "no final answer"
        elif final_at[key] > deadline:
            offending[key] = f"final answer {final_at[key] - deadline:.1f} s after the bound"
    note = f"bound {bound:.0f} s after the faults healed"
    if exempt:
        note += f"; {len(exempt)} exempt, halted for lost writes: {', '.join(exempt[:10])}"
    return PropertyResult(
        "final-answer-within-bound",
        "FAIL" if offending else "PASS",
        len(first_sent) - len(exempt),
        offending,
        note=note,
    )


def _verify_chain(agentsafe: str, path: Path) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            [agentsafe, "verify", "chain", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, str(error)
    first = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, first[0] if first else f"exit {done.returncode}"


def check_evidence(history: History, agentsafe: str | None) -> PropertyResult:
    chains = [Path(p) for p in history.meta.get("chains", [])]
    acted = {
        key: _acted(lines)[0] for key, lines in _received(history.record).items() if _acted(lines)
    }
    if not chains or agentsafe is None:
        return PropertyResult(
            "evidence-verifies-offline", "NOT CHECKED", 0, note="the history has no chain files"
        )
    offending: dict[str, str] = {}
    dispatched: set[str] = set()
    with ThreadPoolExecutor(max_workers=len(chains)) as pool:  # one verifier process per chain
        verdicts = list(pool.map(lambda chain: _verify_chain(agentsafe, chain), chains))
    for chain, (ok, summary) in zip(chains, verdicts, strict=True):
        if not ok:
            offending[f"chain:{chain.name}"] = f"agentsafe verify chain failed: {summary}"
        for line in _lines(chain):
            if line.get("event") == "DISPATCH" and isinstance(line.get("grant_id"), str):
                dispatched.add(str(line["grant_id"]))
    for key, request in sorted(acted.items()):
        if request.get("grant_id") not in dispatched:
            offending[key] = f"grant {request.get('grant_id')} has no DISPATCH evidence"
    return PropertyResult(
        "evidence-verifies-offline",
        "FAIL" if offending else "PASS",
        len(acted),
        offending,
        note=f"{len(chains)} chain files",
    )


def check(history: History, *, agentsafe: str | None = None) -> list[PropertyResult]:
    return [
        check_at_most_once(history),
        check_no_false_not_executed(history),
        check_completed_matches(history),
        check_final_answer(history),
        check_evidence(history, agentsafe),
    ]


def format_report(history: History, results: Sequence[PropertyResult]) -> str:
    meta = history.meta
    lines = [f"seed: {meta.get('seed')}  (replay: make chaos SEED={meta.get('seed')})"]
    lines.append("schedule:")
    for episode in meta.get("schedule", []):
        observed = episode.get("observed")
        suffix = f"  [observed: {observed}]" if observed else ""
        lines.append(f"  {episode.get('describe', episode)}{suffix}")
    keys = {str(a.get("key")) for a in history.answers}
    posts = sum(1 for r in history.record if r.get("event") == "received")
    lines.append(f"keys: {len(keys)}  answers: {len(history.answers)}  provider requests: {posts}")
    lines.append("properties:")
    for result in results:
        note = f" ({result.note})" if result.note else ""
        lines.append(
            f"  {result.status:<11} {result.name}: {result.checked} checked,"
            f" {len(result.offending)} offending{note}"
        )
        for key, why in list(result.offending.items())[:10]:
            lines.append(f"      {key}: {why}")
        if len(result.offending) > 10:
            lines.append(f"      ... and {len(result.offending) - 10} more")
    verdict = "FAIL" if any(r.status == "FAIL" for r in results) else "PASS"
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)
