"""Compare the two Python CEL engines on agentsafe's policy rules, side by side, in one run.

    .venv/bin/python benchmarks/cel_engines.py [--seconds 1.0]

* ``common-expression-language`` (module ``cel``): Rust bindings (the ``cel`` crate).
* ``cel-python`` (module ``celpy``): a pure-Python interpreter (lark parser).

For each engine: compile time of the example policy's rules; evaluation throughput of one whole
decision (build the activation once, try the rules first-match-wins, as ``LocalAuthority`` does)
for each of the example's three outcomes; and a correctness check on the variable types policies
see (int64 arithmetic and overflow, nested maps, strings, bools, timestamps, errors). Results are
recorded in ``docs/cel.md``. Timings are wall-clock on whatever machine runs this; compare the
ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import cel
import celpy
from celpy import celtypes

RULES = [
    "params.amountMinor <= 5000",
    "params.amountMinor <= 50000",
    "true",
]
EXTRA_RULES = [
    "principal.role == 'PROPOSER' && params.currency in ['EUR', 'USD', 'GBP']",
    "params.meta.tags.exists(t, t == 'urgent') || context.caller_principal == principal.id",
    "now.getHours() >= 8 && now < timestamp('2030-01-01T00:00:00Z')",
]
NOW = datetime(2026, 8, 14, 10, 30, tzinfo=UTC)


def activation(amount: int) -> dict[str, Any]:
    return {
        "action": {"type": "create_payout", "resource": "payouts"},
        "target": {"system": "bank", "operation": "payout", "endpoint": "https://bank.test/p"},
        "params": {"amountMinor": amount, "currency": "EUR", "meta": {"tags": ["a", "b"]}},
        "principal": {"id": "agent-1", "role": "PROPOSER", "actor": "bot-1"},
        "tenant": "acme",
        "context": {"caller_principal": "agent-1"},
        "now": NOW,
    }


# -- the two engines behind one shape ------------------------------------------------------------


class RustEngine:
    name = "common-expression-language (cel, Rust)"

    def compile(self, text: str) -> Any:
        return cel.compile(text)

    def prepare(self, variables: dict[str, Any]) -> Any:
        return cel.Context(variables=variables)

    def run(self, program: Any, prepared: Any) -> Any:
        return program.execute(prepared)


class PythonEngine:
    name = "cel-python (celpy, pure Python)"

    def __init__(self) -> None:
        self._env = celpy.Environment()

    def compile(self, text: str) -> Any:
        return self._env.program(self._env.compile(text))

    def prepare(self, variables: dict[str, Any]) -> Any:
        out: dict[str, Any] = {}
        for key, value in variables.items():
            if isinstance(value, datetime):
                out[key] = celtypes.TimestampType(value)
            else:
                out[key] = celpy.json_to_cel(value)
        return out

    def run(self, program: Any, prepared: Any) -> Any:
        return program.evaluate(prepared)


Engine = RustEngine | PythonEngine


def decide(engine: Engine, programs: list[Any], variables: dict[str, Any]) -> int:
    prepared = engine.prepare(variables)
    for index, program in enumerate(programs):
        if engine.run(program, prepared):
            return index
    return -1


# -- timing --------------------------------------------------------------------------------------


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second, best of three rounds of about ``seconds`` / 3 each."""
    for _ in range(50):
        fn()
    rounds = []
    for _ in range(3):
        count = 0
        start = time.perf_counter()
        deadline = start + seconds / 3
        while True:
            for _ in range(20):
                fn()
            count += 20
            now = time.perf_counter()
            if now >= deadline:
                break
        rounds.append(count / (now - start))
    return max(rounds)


def compile_micros(engine: Engine, texts: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for text in texts:
            engine.compile(text)
        samples.append((time.perf_counter() - start) / len(texts))
    return statistics.median(samples) * 1e6


# -- correctness ---------------------------------------------------------------------------------

CHECKS: list[tuple[str, str, dict[str, Any], object]] = [
    # (what, expression, params, expected: a bool, or "error")
    ("int64 comparison", "params.n <= 5000", {"n": 5000}, True),
    ("int64 large values", "params.n * 2 == 9007199254740990", {"n": 4503599627370495}, True),
    ("int64 overflow is an error", "params.n + 1 > 0", {"n": 2**63 - 1}, "error"),
    ("int and double do not mix", "params.n + 0.5 > 1.0", {"n": 1}, "error"),
    ("nested maps", "params.a.b.c == 'x'", {"a": {"b": {"c": "x"}}}, True),
    ("missing key is an error", "params.absent == 1", {}, "error"),
    ("has() on a missing key", "has(params.absent)", {}, False),
    ("list membership", "'b' in params.tags", {"tags": ["a", "b"]}, True),
    ("comprehension", "params.tags.all(t, t.size() == 1)", {"tags": ["a", "b"]}, True),
    ("strings", "params.s.startsWith('ab') && params.s.matches('^a.c$')", {"s": "abc"}, True),
    ("unicode strings", "params.s.size() == 2", {"s": "é€"}, True),
    ("bools", "params.flag == true && !params.off", {"flag": True, "off": False}, True),
    ("bool is not int", "params.flag == 1", {"flag": True}, False),
    ("null", "params.v == null", {"v": None}, True),
    ("timestamp variable", "now > timestamp('2026-08-14T10:00:00Z')", {}, True),
    ("timestamp accessors (UTC)", "now.getHours() == 10 && now.getMinutes() == 30", {}, True),
    ("division by zero is an error", "params.n / 0 == 1", {"n": 1}, "error"),
]


def check(engine: Engine, expression: str, params: dict[str, Any]) -> object:
    variables = activation(1)
    variables["params"] = params
    try:
        result = engine.run(engine.compile(expression), engine.prepare(variables))
    except Exception:
        return "error"
    if isinstance(result, celpy.CELEvalError):  # celpy may return its error as a value
        return "error"
    return bool(result) if isinstance(result, bool | celtypes.BoolType) else result


# -- run -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    args = parser.parse_args()
    engines: list[Engine] = [RustEngine(), PythonEngine()]
    print(f"python {platform.python_version()} on {platform.machine()}")
    print()

    results: dict[str, dict[str, float]] = {}
    for engine in engines:
        row: dict[str, float] = {}
        row["compile example rule (us)"] = compile_micros(engine, RULES, repeat=30)
        row["compile richer rule (us)"] = compile_micros(engine, EXTRA_RULES, repeat=30)
        programs = [engine.compile(text) for text in RULES]
        for label, amount in (("ALLOW", 4200), ("ESCALATE", 20000), ("BLOCK", 90000)):
            variables = activation(amount)
            expected = {"ALLOW": 0, "ESCALATE": 1, "BLOCK": 2}[label]
            assert decide(engine, programs, variables) == expected
            row[f"decisions/s, {label}"] = rate(
                lambda e=engine, p=programs, v=variables: decide(e, p, v), args.seconds
            )
        richer = [engine.compile(text) for text in EXTRA_RULES]
        variables = activation(4200)
        row["richer rule evals/s"] = rate(
            lambda e=engine, r=richer[2], v=variables: e.run(r, e.prepare(v)), args.seconds
        )
        results[engine.name] = row

    rust, python = (results[e.name] for e in engines)
    width = max(len(k) for k in rust)
    print(f"{'':{width}}  {'cel (Rust)':>14}  {'celpy':>14}  {'ratio':>8}")
    for metric in rust:
        lower_is_better = metric.startswith("compile")
        ratio = python[metric] / rust[metric] if lower_is_better else rust[metric] / python[metric]
        print(f"{metric:{width}}  {rust[metric]:>14,.1f}  {python[metric]:>14,.1f}  {ratio:>7.1f}x")
    print("(ratio: how many times better cel (Rust) is; compile in microseconds per rule)")
    print()

    print("correctness on policy variable types")
    for what, expression, params, expected in CHECKS:
        marks = []
        for engine in engines:
            got = check(engine, expression, params)
            marks.append("ok " if got == expected else f"MISMATCH (got {got!r})")
        print(f"  {what:32} {marks[0]:24} {marks[1]}")


if __name__ == "__main__":
    main()
