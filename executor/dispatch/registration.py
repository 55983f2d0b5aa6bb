"""Handler registration without patching: the sealed seam an adopter's own code registers into.

A *registration function* is ``register(seam) -> names | None`` (or a coroutine function). It is
named by ``EXECUTOR_HANDLERS`` (comma-separated ``module:function`` references, or the names of
entry points) or, when that variable is unset, found in the ``agentsafe.handlers`` entry-point group
of the installed distributions (every one, in name order). It receives a :class:`Seam`:

* ``seam.registry`` -- ``register(name, handler)``: a handler with a strict parameter schema
  (``type: object``, ``additionalProperties: false``), the side effect inside ``dispatch.run`` and a
  read-only ``reconcile`` (``dispatch/seam.py``). A policy action runs it by naming it as its
  ``handler``;
* ``seam.downstream`` -- the downstream the configuration names (URL, lookups, timeout);
* ``seam.credential`` -- the credential that proves this process to the downstream; a handler asks
  it for headers at the moment of dispatch and keeps nothing;
* ``seam.fetch`` -- the one guarded outbound client (``egress/guard.py``): the configuration's
  origins and path prefixes and nothing else; inside an execution it sends only from
  ``dispatch.run`` on (a send before it is refused, ``SEND_BEFORE_DISPATCH``, nothing sent:
  ``seam.DispatchBoundFetch``);
* ``seam.effects`` -- the register where a handler that observes an effect records what it saw
  (``dispatch/effects.py``): bound to the exact authorization, handed to the authority's
  finalization and written as one ``EFFECT_OBSERVED`` evidence line, digests only;
* ``seam.plans`` -- plan step executors (``register(step_executor)``) and read-only MCP tools
  (``await register_mcp_read_tool(session, tool_name=..., count_rows=...)``) for the plan routes;
* ``seam.on_close(callback)`` -- something to close when the executor stops (an MCP session).

The registry and the plan executors are sealed the moment the last registration returns: a seam kept
by the function cannot register more later (``REGISTRY_SEALED``). A reference that cannot be loaded,
a function that raises, or a function that returns names it did not register refuses the start with
``HANDLER_REGISTRATION_FAILED`` naming ``EXECUTOR_HANDLERS`` (never the exception's text, which may
carry configuration). The built-in ``forward_request`` handler is registered before them.

Callers: ``assembly.py`` (composes the seam with :func:`compose_seam`, runs the registrations,
seals); ``tools/doctor.py`` (the same seam, to check the registrations);
``handlers.py`` (the public face re-exports :class:`Seam` and :class:`Downstream`).
Also imported by ``proxy.py``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from ..codes import Code
from ..config import ExecutorConfig
from ..egress.credentials import DownstreamCredential
from ..egress.transport import Transport
from ..errors import AgentSafeError, ConfigError
from ..events import EventSink
from ..plans.execute import StepExecutor
from ..plans.mcp_adapter import McpSession, create_read_only_mcp_executor
from .effects import EffectRegister
from .seam import DispatchBoundFetch, Handler, Registry

__all__ = [
    "ENTRY_POINT_GROUP",
    "ActionRegistrar",
    "Downstream",
    "PlanRegistrar",
    "Registration",
    "Seam",
    "compose_seam",
    "load_registrations",
    "run_registrations",
]

ENTRY_POINT_GROUP = "agentsafe.handlers"
VARIABLE = "EXECUTOR_HANDLERS"

Registration = Callable[["Seam"], "Sequence[str] | Awaitable[Sequence[str] | None] | None"]


@dataclass(frozen=True)
class Downstream:
    """The downstream the configuration names; handlers read it, never the environment."""

    url: str
    lookup_url: str | None
    lookup_by_reference_url: str | None
    timeout_ms: int
    system: str | None = None
    operation: str | None = None


class ActionRegistrar:
    """The registry as a registration function sees it: register only, until sealed."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self.registered: list[str] = []

    def register(self, name: str, handler: Handler) -> None:
        self._registry.register(name, handler)
        self.registered.append(name)

    def names(self) -> tuple[str, ...]:
        return self._registry.names()


class PlanRegistrar:
    """Plan step executors and read-only MCP tools, for the plan routes."""

    def __init__(self) -> None:
        self._executors: list[StepExecutor] = []
        self._sealed = False

    def register(self, executor: StepExecutor) -> None:
        if self._sealed:
            raise AgentSafeError("the plan executors are sealed", code=Code.REGISTRY_SEALED)
        self._executors.append(executor)

    async def register_mcp_read_tool(
        self,
        session: McpSession,
        *,
        tool_name: str,
        count_rows: Callable[[Any], object],
        tool: str | None = None,
        timeout_s: float = 30.0,
    ) -> StepExecutor:
        """Bind one read-only tool of an initialised MCP session as a ``read`` step executor
        (``plans/mcp_adapter.py`` checks the tool exists and is annotated read-only)."""
        executor = await create_read_only_mcp_executor(
            session, tool_name=tool_name, count_rows=count_rows, tool=tool, timeout_s=timeout_s
        )
        self.register(executor)
        return executor

    def seal(self) -> tuple[StepExecutor, ...]:
        self._sealed = True
        return tuple(self._executors)


@dataclass(frozen=True)
class Seam:
    """What a registration function receives (see the module docstring)."""

    registry: ActionRegistrar
    downstream: Downstream
    credential: DownstreamCredential | None
    fetch: Transport
    effects: EffectRegister
    plans: PlanRegistrar
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``await callback()`` when the executor stops (or when start-up is refused)."""
        self.closers.append(callback)


def compose_seam(
    config: ExecutorConfig,
    registry: Registry,
    *,
    credential: DownstreamCredential | None,
    transport: Transport,
    effects: EffectRegister,
    closers: list[Callable[[], Awaitable[None]]] | None = None,
) -> Seam:
    """The seam the registration functions receive, composed in this one place: the serving
    process (``assembly.py``) and ``agentsafe doctor`` (``tools/doctor.py``) hand the same
    shape to the same functions (the configuration's downstream, the dispatch-bound fetch)."""
    return Seam(
        registry=ActionRegistrar(registry),
        downstream=Downstream(
            url=config.downstream_url,
            lookup_url=config.downstream_lookup_url,
            lookup_by_reference_url=config.downstream_lookup_by_reference_url,
            timeout_ms=config.downstream_timeout_ms,
            system=config.downstream_system,
            operation=config.downstream_operation,
        ),
        credential=credential,
        fetch=DispatchBoundFetch(transport),
        effects=effects,
        plans=PlanRegistrar(),
        closers=[] if closers is None else closers,
    )


def _refused(problem: str) -> ConfigError:
    return ConfigError(VARIABLE, problem, code=Code.HANDLER_REGISTRATION_FAILED)


def _load_reference(reference: str) -> Registration:
    module_name, _, attribute = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise _refused(f"{reference} cannot be loaded") from exc
    if not callable(target):
        raise _refused(f"{reference} is not callable")
    registration: Registration = target
    return registration


def load_registrations(references: Sequence[str] | None) -> list[tuple[str, Registration]]:
    """The registration functions to run, each with the name it is reported under.

    ``references`` is ``EXECUTOR_HANDLERS`` parsed: a ``module:function`` is imported, any other
    name is looked up in the ``agentsafe.handlers`` group. Unset (``None``): every entry point of
    the group, in name order."""
    group = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if references is None:
        references = sorted(group)
    out: list[tuple[str, Registration]] = []
    for reference in references:
        if ":" in reference:
            out.append((reference, _load_reference(reference)))
            continue
        entry = group.get(reference)
        if entry is None:
            raise _refused(f"{reference} is not an entry point of {ENTRY_POINT_GROUP}")
        try:
            loaded = entry.load()
        except (ImportError, AttributeError) as exc:
            raise _refused(f"the entry point {reference} cannot be loaded") from exc
        if not callable(loaded):
            raise _refused(f"the entry point {reference} is not callable")
        out.append((reference, loaded))
    return out


async def run_registrations(
    registrations: Sequence[tuple[str, Registration]],
    seam: Seam,
    *,
    security: EventSink,
) -> tuple[StepExecutor, ...]:
    """Run every registration against ``seam``; then the registry, the plan executors and the
    are sealed by the caller. Returns the plan step executors."""
    for name, register in registrations:
        before = len(seam.registry.registered)
        try:
            answer = register(seam)
            if inspect.isawaitable(answer):
                answer = await answer
        except AgentSafeError as exc:
            raise _refused(f"{name} refused to register ({exc.code})") from exc
        except Exception as exc:
            raise _refused(f"{name} raised {type(exc).__name__} while registering") from exc
        added = seam.registry.registered[before:]
        if answer is not None:
            if isinstance(answer, str | bytes) or not isinstance(answer, Sequence):
                raise _refused(f"{name} must return the action names it registered, or None")
            if list(answer) != added:
                raise _refused(f"{name} returned names it did not register, or not in order")
        security.emit("HANDLERS_REGISTERED", {"registration": name, "handlers": list(added)})
    return seam.plans.seal()
