"""The chaos checker (``e2e/chaos/checker.py``) on a real history from main and on small ones.

``chaos/histories/pause-after-open-main/`` was captured by the harness itself (``python -m chaos
run --only pause@after-open --seed 29``) on main before the fence of issue 29: key K went to r2,
r2 was SIGSTOPped with its attempt OPEN and no grant claimed, its lease lapsed, r0 took the attempt
over and ran K on the client's retry, and r2, resumed, claimed its own grant and sent K again.
The checker must say FAIL for at-most-once and name K. The small histories below show that each
property can fail and can pass (a checker that always says FAIL proves nothing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from chaos import checker
from chaos.__main__ import main as chaos_main

HISTORIES = Path(__file__).parent / "chaos" / "histories"
PAUSE_KEY = "s29-e0-pause-after-open"


def _by_name(results: list[checker.PropertyResult]) -> dict[str, checker.PropertyResult]:
    return {result.name: result for result in results}


def test_the_pause_history_from_main_fails_at_most_once_naming_the_key() -> None:
    history = checker.load_history(HISTORIES / "pause-after-open-main")
    results = _by_name(checker.check(history))
    at_most_once = results["at-most-once"]
    assert at_most_once.status == "FAIL"
    assert list(at_most_once.offending) == [PAUSE_KEY]
    assert "2 POSTs" in at_most_once.offending[PAUSE_KEY]
    assert results["completed-matches-one-execution"].status == "FAIL"
    assert PAUSE_KEY in results["completed-matches-one-execution"].offending
    report = checker.format_report(history, list(results.values()))
    assert "seed: 29" in report
    assert "pause@after-open" in report
    assert "verdict: FAIL" in report


def test_the_same_history_without_the_second_post_passes(tmp_path: Path) -> None:
    source = HISTORIES / "pause-after-open-main"
    record = [
        json.loads(line) for line in (source / "provider-record.jsonl").read_text().splitlines()
    ]
    late = max(
        (r for r in record if r.get("key") == PAUSE_KEY and r["event"] == "received"),
        key=lambda r: r["at"],
    )
    kept = [r for r in record if r.get("serial") != late["serial"]]
    (tmp_path / "provider-record.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    answers = [json.loads(line) for line in (source / "answers.jsonl").read_text().splitlines()]
    survivor = next(r for r in kept if r.get("key") == PAUSE_KEY and r["event"] == "received")
    for answer in answers:  # the one execution left is the one every COMPLETED names
        if answer["key"] == PAUSE_KEY and answer.get("grant_id"):
            answer["grant_id"] = survivor["grant_id"]
    (tmp_path / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    (tmp_path / "history.json").write_text((source / "history.json").read_text())
    results = _by_name(checker.check(checker.load_history(tmp_path)))
    assert {name: r.status for name, r in results.items()} == {
        "at-most-once": "PASS",
        "no-false-not-executed": "PASS",
        "completed-matches-one-execution": "PASS",
        "final-answer-within-bound": "PASS",
        "evidence-verifies-offline": "NOT CHECKED",
    }
    assert chaos_main(["check", str(tmp_path)]) == 0
    assert chaos_main(["check", str(source)]) == 1


def _history(
    record: list[dict[str, Any]], answers: list[dict[str, Any]], **meta: Any
) -> checker.History:
    return checker.History(
        meta={"seed": 1, "schedule": [], "bound_seconds": 10, "healed_at": 100.0, **meta},
        record=record,
        answers=answers,
    )


def _received(key: str, grant: str, *, first: bool = True) -> dict[str, Any]:
    return {"event": "received", "key": key, "grant_id": grant, "first": first, "mode": "normal"}


def _answer(key: str, at: float = 101.0, **fields: Any) -> dict[str, Any]:
    return {"key": key, "replica": "r0", "sent": 99.0, "at": at, **fields}


def test_a_not_executed_answer_for_a_key_that_ran_fails() -> None:
    history = _history(
        [_received("k", "g1")],
        [_answer("k", status=200, outcome="FAILED_BEFORE_DISPATCH", executed=False)],
    )
    result = checker.check_no_false_not_executed(history)
    assert result.status == "FAIL"
    assert list(result.offending) == ["k"]
    quiet = _history([], history.answers)
    assert checker.check_no_false_not_executed(quiet).status == "PASS"


def test_a_not_executed_answer_a_later_retry_overtook_is_true() -> None:
    """FAILED_BEFORE_DISPATCH before any claim (nothing sent), then the key's retry ran once:
    the first answer was true. The same answer naming the grant the provider later acted
    under is false, whenever the provider acted."""
    later = {**_received("k", "g2"), "at": 150.0}
    overtaken = _history(
        [later],
        [_answer("k", status=200, outcome="FAILED_BEFORE_DISPATCH", executed=False)],
    )
    assert checker.check_no_false_not_executed(overtaken).status == "PASS"
    same_grant = _history(
        [{**later, "grant_id": "g1"}],
        [
            _answer(
                "k", status=200, outcome="DEFINITELY_NOT_EXECUTED", executed=False, grant_id="g1"
            )
        ],
    )
    assert list(checker.check_no_false_not_executed(same_grant).offending) == ["k"]


def test_a_key_that_met_only_the_halt_of_replicas_that_lost_writes_is_exempt() -> None:
    """After an async failover the replicas that found claims missing stay halted until an
    operator resumes them: a key that after the heal met only their 503 EXECUTOR_HALTED waits
    for that operator by design (named as exempt); one that met another replica's is not."""
    halted = {"status": 503, "outcome": "BLOCKED", "reason_codes": ["EXECUTOR_HALTED"]}
    answers = [
        {**_answer("k", at=102.0), "replica": "r1", "sent": 101.0, **halted},
        {**_answer("k", at=130.0), "replica": "r1", "sent": 129.0, **halted},
    ]
    waiting = _history([], answers, halted_for_lost_writes=["r1"])
    result = checker.check_final_answer(waiting)
    assert result.status == "PASS"
    assert "1 exempt" in result.note
    elsewhere = _history([], answers, halted_for_lost_writes=["r0"])
    assert list(checker.check_final_answer(elsewhere).offending) == ["k"]


def test_a_completed_under_another_grant_fails() -> None:
    answers = [_answer("k", status=200, outcome="COMPLETED", grant_id="g2")]
    assert checker.check_completed_matches(_history([_received("k", "g1")], answers)).status == (
        "FAIL"
    )
    assert checker.check_completed_matches(_history([], answers)).status == "FAIL"
    matching = [_answer("k", status=200, outcome="COMPLETED", grant_id="g1")]
    assert checker.check_completed_matches(_history([_received("k", "g1")], matching)).status == (
        "PASS"
    )


@pytest.mark.parametrize(
    ("answers", "status"),
    [
        ([_answer("k", status=409, code="IDEMPOTENCY_IN_PROGRESS")], "FAIL"),
        ([_answer("k", at=111.0, status=200, outcome="COMPLETED")], "FAIL"),
        ([_answer("k", status=200, outcome="UNKNOWN_AFTER_DISPATCH")], "FAIL"),
        ([_answer("k", status=None, error="TimeoutError")], "FAIL"),
        ([_answer("k", at=109.0, status=200, outcome="COMPLETED")], "PASS"),
        ([_answer("k", status=422, code="POLICY_DENIED")], "PASS"),
    ],
)
def test_a_key_needs_a_final_answer_within_the_bound(
    answers: list[dict[str, Any]], status: str
) -> None:
    assert checker.check_final_answer(_history([], answers)).status == status


def _chain(path: Path, grants: list[str]) -> None:
    """A chain in the executor's own format (hash over the RFC 8785 form, seq, prev_hash)."""
    from agentsafe.executor.canonical import canonical_text, sha256_digest
    from agentsafe.executor.events import EVIDENCE_SCHEMA, GENESIS_HASH

    lines, previous = [], GENESIS_HASH
    for seq, grant in enumerate(grants, 1):
        body: dict[str, Any] = {
            "schema": EVIDENCE_SCHEMA,
            "seq": seq,
            "prev_hash": previous,
            "at": "2026-12-02T01:00:00.000Z",
            "event": "DISPATCH",
            "grant_id": grant,
        }
        if seq == 1:
            body["genesis"] = True
        body["hash"] = previous = sha256_digest(body)
        lines.append(canonical_text(body))
    path.write_text("\n".join(lines) + "\n")


def test_a_chain_that_does_not_verify_or_lacks_a_dispatch_fails(tmp_path: Path) -> None:
    agentsafe = str(Path(sys.executable).parent / "agentsafe")  # the real offline verifier
    chain = tmp_path / "r0.stdout.jsonl"
    _chain(chain, ["g1", "g0"])
    history = _history([_received("k", "g1")], [], chains=[str(chain)])
    assert checker.check_evidence(history, agentsafe).status == "PASS"
    missing = _history([_received("k", "g2")], [], chains=[str(chain)])
    result = checker.check_evidence(missing, agentsafe)
    assert result.status == "FAIL"
    assert "k" in result.offending
    chain.write_text(chain.read_text().replace('"g0"', '"gX"'))  # altered after the fact
    result = checker.check_evidence(history, agentsafe)
    assert result.status == "FAIL"
    assert "chain:r0.stdout.jsonl" in result.offending


def test_a_replica_that_finds_its_lost_writes_after_the_heal_still_makes_the_wait_by_design() -> (
    None
):
    """CI, seed 29: at the heal only r1 had halted for lost writes; r2 and r0 found theirs 0.1 s
    later, and r0 had meanwhile answered the key 503 STORE_UNAVAILABLE. With every replica
    halted by the end, the key waits for an operator; it would not if its last answer were
    anything but the halt, or if a replica that never halted had answered it."""
    halted = {"status": 503, "outcome": "BLOCKED", "reason_codes": ["EXECUTOR_HALTED"]}
    unavailable = {"status": 503, "outcome": "BLOCKED", "reason_codes": ["STORE_UNAVAILABLE"]}
    answers = [
        {**_answer("k", at=100.4), "replica": "r0", "sent": 100.3, **unavailable},
        {**_answer("k", at=100.9), "replica": "r1", "sent": 100.8, **halted},
        {**_answer("k", at=101.4), "replica": "r2", "sent": 101.3, **halted},
        {**_answer("k", at=101.9), "replica": "r0", "sent": 101.8, **halted},
    ]
    everyone = ["r0", "r1", "r2"]
    result = checker.check_final_answer(_history([], answers, halted_for_lost_writes=everyone))
    assert result.status == "PASS"
    assert "1 exempt" in result.note
    at_the_heal = _history([], answers, halted_for_lost_writes=["r1"])
    assert list(checker.check_final_answer(at_the_heal).offending) == ["k"]
    last_not_a_halt = _history(
        [], [*answers, {**answers[0], "sent": 102.3}], halted_for_lost_writes=everyone
    )
    assert list(checker.check_final_answer(last_not_a_halt).offending) == ["k"]


def test_a_key_only_halted_replicas_answered_is_exempt_and_named() -> None:
    halted = [_answer("k", status=503, code="EXECUTOR_HALTED", lost_writes=True)]
    result = checker.check_final_answer(_history([], halted))
    assert result.status == "PASS"
    assert result.checked == 0
    assert "exempt, halted for lost writes: k" in result.note


def test_the_schedule_is_the_seed_s_and_the_short_run_has_every_fault_class() -> None:
    from chaos.schedule import FAULT_CLASSES, long_schedule, short_schedule

    short = short_schedule(29)
    assert sorted(e.fault for e in short) == sorted(FAULT_CLASSES)
    assert [e.as_dict() for e in short] == [e.as_dict() for e in short_schedule(29)]
    assert [e.fault for e in short] != [e.fault for e in short_schedule(30)]
    long = long_schedule(29, 600)
    assert len(long) > len(short)
    assert [e.fault for e in long[: len(short) - 1]] == [e.fault for e in short[:-1]]
    assert len({e.key for e in long}) == len(long)
    # The async failover halts the replicas that lost claims until an operator resumes them:
    # it ends every schedule, so each other class strikes a running system.
    for seed in (29, 30, 31):
        assert short_schedule(seed)[-1].fault == "failover-async"
        assert [e.fault for e in long_schedule(seed, 600)].index("failover-async") == len(
            long_schedule(seed, 600)
        ) - 1
