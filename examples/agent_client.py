"""A LangGraph-style tool that pays through agentsafe: the agent proposes, the boundary decides.

No agent framework is a dependency. A tool is an async function with a docstring and typed
arguments that returns text for the model; that is what LangGraph's ``@tool`` (langchain_core),
the OpenAI Agents SDK's ``function_tool`` or a plain loop wraps. With LangGraph::

    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    client = AgentSafeClient(os.environ["AGENTSAFE_EXECUTOR_URL"], token=agent_token)
    agent = create_react_agent(model, tools=[tool(payout_tool(client))])

The tool holds no credential for the bank: only the agent's own token for the executor. BLOCK and
ESCALATE are answers the model reads, not exceptions; a lost outcome is reconciled with the
recovery object, never sent again; a retry reuses the idempotency key the client chose.

Run it against ``make demo``'s executor (or any executor): ``python examples/agent_client.py URL
TOKEN``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

from agentsafe.client import AgentSafeClient, Outcome, Refused, Unavailable, Verdict


def payout_tool(client: AgentSafeClient) -> Callable[[int, str, str], Awaitable[str]]:
    async def create_payout(amount_minor: int, currency: str, beneficiary: str) -> str:
        """Pay a beneficiary. amount_minor is in minor units (cents); currency is ISO 4217
        (e.g. USD). Large payouts are refused or held for a person by the bank's policy."""
        try:
            decision = await client.propose(
                "create_payout",
                f"payout:{beneficiary}",
                {"amountMinor": amount_minor, "currency": currency},
            )
            if decision.needs_reconciliation and decision.recovery is not None:
                decision = await client.reconcile(decision.recovery)
        except Refused as refused:
            return f"The payment boundary refused the request ({refused.code}). Do not retry."
        except Unavailable as unavailable:
            return (
                "The payment boundary is unavailable right now; nothing was paid. Retry later "
                f"with idempotency key {unavailable.idempotency_key}."
            )
        if decision.outcome == Outcome.COMPLETED:
            return f"Paid {amount_minor} {currency} minor units to {beneficiary}."
        if decision.verdict == Verdict.ESCALATE:
            request = (decision.escalation or {}).get("request_id", "pending")
            return f"Held for a person's approval (request {request}); nothing was paid yet."
        if decision.verdict == Verdict.BLOCK:
            return f"Refused by policy: {', '.join(decision.reason_codes)}. Nothing was paid."
        return f"Not completed: {decision.summary()}. Nothing is known to have been paid."

    return create_payout


async def _main(url: str, token: str) -> None:
    async with AgentSafeClient(url, token=token) as client:
        tool = payout_tool(client)
        for amount in (1200, 20000, 900000):
            print(await tool(amount, "USD", "synthetic-beneficiary-1"))


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
