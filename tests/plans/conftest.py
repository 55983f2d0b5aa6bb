from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.plans import (
    Ed25519Signer,
    dry_run_agent_plan,
    execute_agent_plan_step,
    issue_agent_approval,
)
from agentsafe.executor.state.usestore import SQLiteUseStore

from . import support as s


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteUseStore]:
    opened = await SQLiteUseStore.open(tmp_path / "state", clock=s.manual_clock())
    yield opened
    await opened.close()


@pytest.fixture
def approver() -> Ed25519Signer:
    return s.signer()


@pytest.fixture
def receipt_signer() -> Ed25519Signer:
    return s.signer()


class World:
    """One plan, dry run and approval, and a way to execute its step."""

    def __init__(
        self, store: SQLiteUseStore, approver: Ed25519Signer, receipt_signer: Ed25519Signer
    ) -> None:
        self.store = store
        self.approver = approver
        self.receipt_signer = receipt_signer
        self.policy = s.policy()
        self.plan = s.plan()
        self.dry_run = dry_run_agent_plan(self.plan, self.policy, now=s.NOW)
        self.audit = s.MemoryAudit()
        self.executor = s.RecordingExecutor()
        self.clock = s.manual_clock()
        self.approval: Any = None

    async def approve(self, **request: Any) -> Any:
        self.approval = await issue_agent_approval(
            self.dry_run,
            self.policy,
            s.request(**request),
            self.approver,
            now=s.NOW,
            max_clock_skew_ms=5_000,
        )
        return self.approval

    def kwargs(self, **overrides: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "dry_run": self.dry_run,
            "policy": self.policy,
            "approval": self.approval,
            "approval_verifier": self.approver.verifier(),
            "context": s.context(),
            "step_id": "query-incidents",
            "operation": s.operation(),
            "use_consumer": self.store,
            "executor": self.executor,
            "audit_sink": self.audit,
            "receipt_signer": self.receipt_signer,
            "execution_id": "execution-42",
            "clock": self.clock,
            "max_clock_skew_ms": 5_000,
        }
        base.update(overrides)
        return base

    async def execute(self, **overrides: Any) -> Any:
        return await execute_agent_plan_step(**self.kwargs(**overrides))

    def verify_kwargs(self, **overrides: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "dry_run": self.dry_run,
            "policy": self.policy,
            "approval": self.approval,
            "approval_verifier": self.approver.verifier(),
            "receipt_verifier": self.receipt_signer.verifier(),
            "context": s.context(),
            "use_verifier": self.store,
            "max_clock_skew_ms": 5_000,
        }
        base.update(overrides)
        return base


@pytest.fixture
async def world(
    store: SQLiteUseStore, approver: Ed25519Signer, receipt_signer: Ed25519Signer
) -> World:
    w = World(store, approver, receipt_signer)
    await w.approve()
    return w


Factory = Callable[..., Any]
