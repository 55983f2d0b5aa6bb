"""The protocol model has teeth: without the fence, spin finds issue 29's double execution.

``tests/model/protocol.pml`` built with ``NOFENCE`` (the claim not fenced by the attempt's owner
and epoch, no lease check before the send: the code before issue 29) must make spin report an
error whose trail (``spin -t``) is the reproduction of the issue: replica A opens its attempt and
stops before its claim is recorded, A's lease lapses, another replica C takes the attempt over
and concludes UNCLAIMED, the caller's retry runs on a replica B (execution 1), A resumes, claims
its own grant and sends (execution 2). The same small configuration with the fence finds 0
errors, and so does each of the model's known gaps (``GAP_...``) once closed, while each gap
switched on finds its counterexample.

Without spin (Debian's ``spin``: ``make model`` installs it as root) these skip with one line,
unless ``CI=true`` or ``AGENTSAFE_E2E=require``, when they fail.

Callers: pytest (``make unit``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.model.check import build, spin_available, trail, verify

pytestmark = pytest.mark.slow  # each builds and searches a verifier: seconds to a minute

# The issue's setting: three replicas, one key, a client that retries it, one pause; no grant
# expires within the run, so a double execution is the only thing that can go wrong.
REPRO = ("NR=3", "NK=1", "MAXPAUSE=1", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0", "NOEXPIRE")


@pytest.fixture(autouse=True)
def _spin() -> None:
    if spin_available():
        return
    message = "no spin or cc on PATH: run `make model` as root (apt-get install spin)"
    if os.environ.get("CI") == "true" or os.environ.get("AGENTSAFE_E2E") == "require":
        pytest.fail(message)
    pytest.skip(message)


def _step(steps: list[str], pattern: str, start: int) -> tuple[int, re.Match[str]]:
    """The first step at or after ``start`` matching ``pattern``."""
    for index in range(start, len(steps)):
        match = re.fullmatch(pattern, steps[index])
        if match:
            return index, match
    raise AssertionError(f"no step {pattern!r} after step {start} in:\n" + "\n".join(steps))


def test_without_the_fence_spin_finds_the_double_execution_of_issue_29(tmp_path: Path) -> None:
    defines = (*REPRO, "NOFENCE")
    build(tmp_path, defines, collapse=False)
    result = verify(tmp_path)
    assert result.errors == 1, result.output
    steps = trail(tmp_path, defines)

    at, m = _step(steps, r"STEP open r=(\d) a=(\d) k=0 epoch=1", 0)
    a_rep, a_att = m.group(1), m.group(2)
    at, _ = _step(steps, rf"STEP pause r={a_rep}", at + 1)
    # A stopped before its attempt's row said "claimed" (the takeover reads that row)
    assert not any(
        re.fullmatch(rf"STEP grant-claimed r={a_rep} a={a_att}", s) for s in steps[:at]
    ), steps
    at, _ = _step(steps, rf"STEP lapse a={a_att} owner={a_rep}", at + 1)
    at, m = _step(steps, rf"STEP takeover r=(\d) a={a_att} k=0 epoch=\d+ claimed=0", at + 1)
    c_rep = m.group(1)
    assert c_rep != a_rep
    at, _ = _step(steps, rf"STEP resolve r={c_rep} a={a_att} k=0 resolution=1", at + 1)  # UNCLAIMED
    # the retry runs on B (not A, which is stopped): execution 1
    at, m = _step(steps, r"STEP begin r=(\d) a=(\d) k=0 (?:NEW|TAKEOVER_KEY)", at + 1)
    b_rep, b_att = m.group(1), m.group(2)
    assert b_rep != a_rep
    assert b_att != a_att
    at, _ = _step(steps, rf"STEP claim r={b_rep} a={b_att} k=0 UNFENCED", at + 1)
    at, _ = _step(steps, rf"STEP send r={b_rep} a={b_att} k=0", at + 1)
    # A resumes, records its own claim and sends: two executions of key 0
    at, _ = _step(steps, rf"STEP resume r={a_rep}", at + 1)
    at, _ = _step(steps, rf"STEP grant-claimed r={a_rep} a={a_att}", at + 1)
    at, _ = _step(steps, rf"STEP send r={a_rep} a={a_att} k=0", at + 1)
    # both sends reach the provider (which lands first is the scheduler's): key 0 twice
    executed = [
        (m.group(1), m.group(2))
        for m in (re.fullmatch(r"STEP execute a=(\d) k=0 execution=(\d)", s) for s in steps)
        if m
    ]
    assert sorted(a for a, _ in executed) == sorted([a_att, b_att]), steps
    assert [n for _, n in executed] == ["1", "2"], steps
    failure = "\n".join(s for s in steps if not s.startswith("STEP "))
    assert "assertion violated" in failure, steps
    assert "execs[" in failure, failure  # the at-most-once assertion


def test_with_the_fence_the_same_setting_has_no_error(tmp_path: Path) -> None:
    build(tmp_path, REPRO)
    result = verify(tmp_path)
    assert result.complete, result.output
    assert result.errors == 0, result.output


# A behaviour of the code the model found wrong, as a switch: on, spin finds its counterexample.
GAPS = {
    # a request whose key was taken over before its attempt opened answers
    # FAILED_BEFORE_DISPATCH / executed:false while the retry that took the key executes it
    "GAP_TAKEN_OVER_NOT_EXECUTED": (
        ("NK=1", "MAXPAUSE=1", "MAXCRASH=0", "MAXPART=0", "MAXFAIL=0", "NOEXPIRE"),
        r"STEP open r=\d a=\d k=0 KEY_TAKEN_OVER",
    ),
    # a restarted replica renews the open attempts its id owns that it knows nothing of (one
    # it took over and had not resolved when it crashed): nobody ever resolves them
    "GAP_RENEW_ALL": (
        ("NK=1", "MAXPAUSE=0", "MAXCRASH=1", "MAXPART=0", "MAXFAIL=0"),
        r"STEP crash r=\d",
    ),
}


@pytest.mark.parametrize("gap", sorted(GAPS))
def test_each_known_gap_switched_on_has_a_counterexample(tmp_path: Path, gap: str) -> None:
    defines, expected = GAPS[gap]
    build(tmp_path, (*defines, gap))
    result = verify(tmp_path)
    assert result.errors == 1, result.output
    steps = trail(tmp_path, (*defines, gap))
    assert any(re.fullmatch(expected, s) for s in steps), "\n".join(steps)
