"""What the end-to-end scenario needs from a backend, and nothing more.

Role: ``e2e/test_scenario.py`` runs one sequence of steps (render, execute once, refuse another
ServiceAccount, halt, unhalt, restart while halted, delete, and what only real pods show) on a
real cluster. The steps talk to the cluster through kubectl themselves; a backend only answers
the questions whose answers depend on where the cluster runs:

* where the operator runs and how to read its log;
* where the downstream provider is, as the executor reaches it (``url``, ``cidrs``) and as the
  test reads it (``received``);
* how to run, reach and restart the executor pod the operator rendered.

Implementation: :mod:`kind_backend`, for both ``--backend=node`` (the one-node cluster of
:mod:`node`) and ``--backend=kind``: the chart's Deployment, real StatefulSet pods through
``kubectl port-forward``, an in-cluster TLS provider. (The loopback control plane had a kubelet
stand-in and a pod-network stand-in here; the real node replaced both.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Provider:
    """The downstream the AgentPolicy points at."""

    url: str
    """Base URL as the executor reaches it (``{url}/payouts``)."""
    cidrs: tuple[str, ...]
    """``spec.downstream.cidrs``: the addresses the executor's egress NetworkPolicy allows."""
    ca_pem: str
    """The CA that issued the provider's certificate (``spec.downstream.ca``)."""
    received: Callable[[], list[str]]
    """The idempotency keys of the payout requests that reached the provider."""
    set_mode: Callable[[str], None] | None = None
    """Switch the provider's mode (``normal``, ``hang``, ...; ``POST /_control/mode``), where
    the backend can reach it (the in-cluster provider)."""


@dataclasses.dataclass(frozen=True)
class Deadlines:
    """How long the scenario waits for what a backend does at its own pace (seconds)."""

    policy_ready: float
    """The AgentPolicy's Ready=True once the pod is ready: the operator watches its StatefulSet
    (the 60 s reconcile timer is only the backstop), so this covers a loaded machine, not the
    timer."""
    executor_ready: float
    """A started executor answering ``/ready`` with 200."""
    listening: float
    """A restarted executor answering at all."""
    resume: float
    """Unhalted and answering again: the operator's /resume is refused with 409 until the
    pod's ConfigMap volume no longer holds the halt file (a kubelet syncs within ~a minute)."""


class ScenarioBackend(Protocol):
    """One way to run the scenario's operator, executor and provider."""

    name: str
    deadlines: Deadlines
    provider: Provider

    def start_executor(
        self, statefulset: Mapping[str, Any], *, ready: Callable[[], bool]
    ) -> AbstractContextManager[None]:
        """Run pod 0 of the operator's ``statefulset``; return once ``ready()`` is true (it
        probes through :meth:`executor_url`); stop reaching it on exit."""
        ...

    @property
    def pod_name(self) -> str:
        """The executor pod's name, as the HaltSwitch status records it."""
        ...

    def executor_url(self) -> str:
        """``https://localhost:PORT``: the executor as this process reaches it (its test
        certificate names ``localhost``)."""
        ...

    def reach_again(self) -> None:
        """Pod 0 was replaced by its controller (a rollout): reach the new one from now on."""
        ...

    def restart_executor(self) -> None:
        """Stop the executor and start it again from the same rendered pod; return once it
        runs (it may not listen yet)."""
        ...

    def executor_tail(self, lines: int = 40) -> str: ...

    def operator_tail(self, lines: int = 40) -> str: ...
