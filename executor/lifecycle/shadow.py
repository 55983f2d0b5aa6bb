"""The shadow report: what enforcement would have done, counted while the process observes.

In ``EXECUTOR_MODE=SHADOW`` nothing executes; every proposal is decided and recorded here, by
action and verdict (ALLOW, BLOCK, ESCALATE, or NO_VERDICT when the authority could not answer),
and by observation status (OBSERVED, UNAVAILABLE, TIMED_OUT, INVALID). The process prints
:meth:`ShadowReport.render` when it stops, ending with the switch that turns enforcement on.

Counting is guarded by a lock, so request handlers on the event loop and threads may record
concurrently. Nothing here holds a parameter, an identifier or a caller: only action names and
counts.

Callers: the pipeline (``record``), ``assembly.py`` (builds it), ``plane.py`` (holds it; the
process prints ``render`` at shutdown), ``/metrics``, ``tools/status_cli.py`` (``render_report``
of a running executor's status).
Also imported by ``pipeline.py``, ``serve.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..policy.policy import Verdict

__all__ = [
    "ENFORCEMENT_SWITCH",
    "OBSERVATION_STATUSES",
    "RECORDED_STATUSES",
    "VERDICTS",
    "ShadowReport",
    "closing_line",
    "render_report",
]

VERDICTS = tuple(verdict.value for verdict in Verdict)
NO_VERDICT = "NO_VERDICT"
OBSERVATION_STATUSES = ("OBSERVED", "UNAVAILABLE", "TIMED_OUT", "INVALID")
RECORDED_STATUSES = frozenset({"OBSERVED", "INVALID"})
"""The observations whose answer is final: recorded for the idempotency key and replayed."""
ENFORCEMENT_SWITCH = "EXECUTOR_MODE=ENFORCEMENT"


class ShadowReport:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_action: dict[str, Counter[str]] = {}
        self._statuses: Counter[str] = Counter()

    def record(self, action: str, verdict: str | None, status: str) -> None:
        """Count one observed proposal. An unknown verdict or status is a programming error."""
        column = NO_VERDICT if verdict is None else str(verdict)
        if column not in VERDICTS and column != NO_VERDICT:
            raise ValueError("unknown verdict")
        if status not in OBSERVATION_STATUSES:
            raise ValueError("unknown observation status")
        with self._lock:
            self._by_action.setdefault(action, Counter())[column] += 1
            self._statuses[status] += 1

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._statuses.values())

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            actions = {
                name: {v: counts.get(v, 0) for v in (*VERDICTS, NO_VERDICT)}
                for name, counts in sorted(self._by_action.items())
            }
            statuses = {s: self._statuses.get(s, 0) for s in OBSERVATION_STATUSES}
        return {
            "total": sum(statuses.values()),
            "actions": actions,
            "observations": statuses,
            "enforcement_switch": ENFORCEMENT_SWITCH,
        }

    def render(self) -> str:
        """Plain text for the terminal at shutdown, ending with the enforcement switch."""
        return render_report(self.as_dict())


def render_report(data: Mapping[str, Any]) -> str:
    """The report as text from its JSON form (``as_dict``, or the status route's
    ``shadow_report``): by action and verdict, then the observations and the switch."""
    columns = (*VERDICTS, NO_VERDICT)
    name_width = max([len("action"), *(len(a) for a in data["actions"])])
    lines = [f"Shadow report: {data['total']} proposal(s) observed, none executed.", ""]
    header = "  ".join([f"{'action':<{name_width}}", *(f"{c:>10}" for c in columns)])
    lines.append(header)
    lines.append("-" * len(header))
    for action, counts in data["actions"].items():
        cells = [f"{action:<{name_width}}", *(f"{counts[c]:>10}" for c in columns)]
        lines.append("  ".join(cells))
    if not data["actions"]:
        lines.append("(no proposals)")
    lines.append("")
    lines.append("Observations: " + ", ".join(f"{s} {n}" for s, n in data["observations"].items()))
    lines.append(closing_line(data.get("enforcement_switch", ENFORCEMENT_SWITCH)))
    return "\n".join(lines) + "\n"


def closing_line(switch: str = ENFORCEMENT_SWITCH) -> str:
    """What to do next, as the report ends (and ``serve.py``'s SHADOW_REPORT line says)."""
    return f"To enforce these decisions, restart with {switch}"
