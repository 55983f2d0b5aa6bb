"""agentsafe.client: how an agent (any framework) calls the boundary.

The agent never holds a credential for the system it changes; it holds only its own credential
for the executor, and proposes::

    from agentsafe.client import AgentSafeClient

    async with AgentSafeClient("https://executor:8443", token=token, ca_file=ca) as client:
        decision = await client.propose("create_payout", "payout:b-1", {"amountMinor": 1200,
                                                                       "currency": "USD"})
        if decision.needs_reconciliation:
            decision = await client.reconcile(decision.recovery)
        elif decision.escalation is not None:          # a person decides; later:
            decision = await client.resume(decision.escalation)

:meth:`AgentSafeClient.propose` picks one idempotency key per proposal (or takes yours) and
sends *that same key* on every retry, so a retry can never execute twice. It waits politely:
on ``409 IDEMPOTENCY_IN_PROGRESS`` (the first attempt with this key is still running) it backs
off and asks again; on a ``503`` with ``Retry-After`` (halted, the store unavailable) it waits
as long as the executor asks, up to ``max_wait`` seconds in all; a connection that fails before
an answer is retried with the same key. Answers are typed (:class:`Decision`, with
:class:`Verdict` and :class:`Outcome`); :meth:`AgentSafeClient.actions` lists what the caller may
propose (:class:`ActionInfo`).

Exceptions, one root (:class:`AgentSafeClientError`)::

    AgentSafeClientError
    ├── Refused        the executor answered with an error body: status, code, message
    └── Unavailable    no final answer within max_wait (the key to retry with later)

A BLOCK or an ESCALATE is not an exception: it is a :class:`Decision` the agent reads.

The package imports nothing of the executor's server (an import-linter contract holds it), so an
agent host installs it without running anything. Its HTTP client is aiohttp.

Callers: agent hosts (docs/client.md; examples/agent_client.py is a LangGraph-style tool).
"""

from __future__ import annotations

from ._client import AgentSafeClient
from ._models import (
    ActionInfo,
    AgentSafeClientError,
    Decision,
    Outcome,
    Refused,
    Unavailable,
    Verdict,
)

__all__ = [
    "ActionInfo",
    "AgentSafeClient",
    "AgentSafeClientError",
    "Decision",
    "Outcome",
    "Refused",
    "Unavailable",
    "Verdict",
]
