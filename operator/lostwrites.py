"""An AgentPolicy's ``StoreLostWrites`` condition: which keys its executors' database lost.

An executor with a shared PostgreSQL store checks its journal's grant claims against every new
database server and halts with cause ``STORE_LOST_WRITES`` when claims it acknowledged are
missing (an asynchronous failover; the executor's ``state/lostwrites.py``). Each executor lists
them in ``GET /v1/control/status`` (``store_lost_writes``). At every reconcile of a policy with
``spec.store`` (its create, update and the drift timer), :func:`read_lost_writes` reads that list
from each executor pod as the operator's OPERATOR principal (``halt.control_target``: the same
endpoints, token and TLS trust as the halt), and :func:`lost_writes_condition` sets the
condition:

- ``True``, reason ``LostWritesFound``: some pod lists claims; the message names, per pod, the
  count and the keys (``tenant/principal/key``, the first :data:`MAX_KEYS_SHOWN`) and points to
  docs/playbooks/store-lost-writes.md;
- ``False``, reason ``NoLostWrites``: every pod that answered lists none;
- unchanged when no pod could be read (no endpoints yet, the executors unreachable): the last
  word stands, a halted executor is still reachable (its Service lists it not ready).

Callers: ``reconcile.py`` (:func:`reconcile_policy`), the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from .conditions import set_condition
from .control import StatusResult
from .halt import control_target
from .models import AgentPolicySpec, Condition, ConditionReason, ConditionType
from .render import PolicyRef
from .runtime import Runtime

__all__ = ["MAX_KEYS_SHOWN", "PLAYBOOK", "lost_writes_condition", "read_lost_writes"]

MAX_KEYS_SHOWN: Final = 20
"""Keys named per pod in the message; the count is always whole."""
PLAYBOOK: Final = "docs/playbooks/store-lost-writes.md"


async def read_lost_writes(
    rt: Runtime, ref: PolicyRef, spec: AgentPolicySpec
) -> list[StatusResult]:
    """Each executor pod's ``store_lost_writes``; empty when none can be asked."""
    target = await control_target(rt, ref, spec)
    if not target.endpoints or target.missing or target.context is None:
        return []
    return await rt.control.status_all(
        target.endpoints,
        token=target.token,
        port=rt.settings.port,
        server_hostname=target.server_hostname,
        context=target.context,
    )


def _key(claim: dict[str, Any]) -> str:
    parts = [claim.get(name) for name in ("tenant", "principal", "idempotency_key")]
    text = "/".join(str(p) if isinstance(p, str) else "?" for p in parts)
    if claim.get("rerun_elsewhere") is True:
        text += " (rerun elsewhere)"
    return text


def lost_writes_condition(
    conditions: Sequence[Condition], results: Sequence[StatusResult], *, generation: int | None
) -> list[Condition]:
    """``conditions`` with ``StoreLostWrites`` set from the pods' answers (unchanged when no
    pod answered)."""
    answered = [r for r in results if r.lost is not None]
    if not answered:
        return list(conditions)
    found = [r for r in answered if r.lost]
    if not found:
        return set_condition(
            conditions,
            type=ConditionType.STORE_LOST_WRITES,
            status=False,
            reason=ConditionReason.NO_LOST_WRITES,
            message=f"{len(answered)} executor pods list no lost grant claims",
            generation=generation,
        )
    parts = []
    for result in sorted(found, key=lambda r: r.pod):
        lost = result.lost or ()
        keys = ", ".join(_key(c) for c in lost[:MAX_KEYS_SHOWN])
        more = f" and {len(lost) - MAX_KEYS_SHOWN} more" if len(lost) > MAX_KEYS_SHOWN else ""
        parts.append(f"{result.pod}: {len(lost)} ({keys}{more})")
    total = sum(len(r.lost or ()) for r in found)
    return set_condition(
        conditions,
        type=ConditionType.STORE_LOST_WRITES,
        status=True,
        reason=ConditionReason.LOST_WRITES_FOUND,
        message=(
            f"the store lost {total} acknowledged grant claim(s); the executors halted"
            f" (STORE_LOST_WRITES) and never send these keys again. {'; '.join(parts)}."
            f" See {PLAYBOOK}"
        ),
        generation=generation,
    )
