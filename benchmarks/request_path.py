"""Trace one ALLOW through a real assembled executor: which agentsafe modules it visits, and how
often the path goes back and forth between them.

Starts the synthetic provider in its own process (as ``benchmarks/profile.py`` does), assembles
an executor in this process, opens its listener on loopback, sends one ALLOW untraced (the
warm-up), then sends a second one with ``sys.setprofile`` installed around the request and
prints the agentsafe modules the ALLOW visits, the moves between them, the returns to a module
already left (a move into a module visited earlier in the same path), the visits per module (a
visit is one uninterrupted stretch in that module), and whether ``plane.py`` or ``assembly.py``
was entered. Two methods (``--method``):

- ``calls`` (the default; issue 32's method): only *call* events count. The current module is
  the module whose source file holds the code of the frame last called (code compiled from a
  string, such as the ``__init__`` that ``dataclasses`` generates, belongs to none); a coroutine
  resumed after an ``await`` that suspended is a call event too (CPython re-enters its whole
  await chain, outermost first), so each real suspension walks the chain again. Returns are not
  events: the path moves back to a module only when that module calls (or is resumed) again.
  The streams are not chained (as the executor is assembled in tests). On the old main
  (9f2c0a6) this gives 27 modules, 98 moves, 72 returns, pipeline + attempt 25 visits, seam +
  forward 19, where the issue reported 27, 97, 71, 24 and 20 (docs/architecture.md, "Measured").
- ``moves``: calls *and* returns count, an ``await`` that suspends and the re-entry of its
  await chain on resume are not moves (``RESUME`` and ``YIELD_VALUE`` tell them apart, CPython
  3.11 and later), and the streams are chained and redacted (as ``agentsafe serve`` assembles
  it, the lines kept in memory).

In both, frames of other packages are transparent, and so is the ground floor in the first
count (pyproject's ground-floor contract; a package there with its modules); the second counts
every agentsafe module. The ``moves`` method names a frame's module by its globals. Only this
thread is traced: work the executor hands to a worker thread (SQLite, fsync) is not counted,
and the HTTP client (aiohttp) is not agentsafe, so it is transparent.

    .venv/bin/python benchmarks/request_path.py [--method calls|moves] [--path]

``--path`` also prints the whole sequence of visits (with ``calls``, one a line: the module and
function of the visit's first frame, ``(R)`` when it is a coroutine resumed after a suspension).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dis
import io
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

import agentsafe.executor
from agentsafe.executor.assembly import assemble
from agentsafe.executor.events import DeferredSink, Streams
from agentsafe.executor.tools.harness import ProviderProcess, Workspace

PACKAGE = "agentsafe."
ROOT = Path(__file__).resolve().parent.parent


def ground_floor() -> frozenset[str]:
    """The ground floor's modules, as pyproject's import contract names them."""
    document = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in document["tool"]["importlinter"]["contracts"]:
        if contract["name"].startswith("the ground floor"):
            return frozenset(
                m.removeprefix("agentsafe.executor.") for m in contract["source_modules"]
            )
    raise SystemExit("pyproject.toml names no ground floor contract")


def _module(frame: FrameType | None) -> str | None:
    """The agentsafe module ``frame`` runs in (``lifecycle.pipeline``), by its globals, else
    ``None`` (the ``moves`` method)."""
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    if not isinstance(name, str) or not name.startswith(PACKAGE):
        return None
    return name.removeprefix("agentsafe.executor.").removeprefix(PACKAGE)


EXECUTOR_DIR = str(Path(agentsafe.executor.__file__).resolve().parent) + "/"


def _source_module(frame: FrameType) -> str | None:
    """The executor module whose source file holds ``frame``'s code (``lifecycle.pipeline``),
    else ``None`` (the ``calls`` method). Code compiled from a string is no module's source:
    the ``__init__``, ``__eq__``... that ``dataclasses`` generates for a class defined in a
    module has the filename ``<string>``, so constructing a dataclass is not a visit to the
    module that defines it (as it is by the frame's globals)."""
    filename = frame.f_code.co_filename
    if not filename.startswith(EXECUTOR_DIR):
        return None
    dotted = filename[len(EXECUTOR_DIR) :].removesuffix(".py").replace("/", ".")
    return dotted.removesuffix(".__init__")


class CallTrace:
    """The ``calls`` method: the sequence of agentsafe modules whose frames are called (a
    coroutine resumed included), consecutive repeats collapsed into one visit; the modules in
    ``transparent`` are not counted."""

    def __init__(self, transparent: frozenset[str] = frozenset()) -> None:
        self.visits: list[str] = []
        self.labels: list[str] = []
        """Each visit as ``module:function`` of its first frame, ``(R)`` when that frame is a
        coroutine resumed (``--path``)."""
        self.transparent = transparent

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = _source_module(frame)
        if module is None or _within(module, self.transparent):
            return
        if not self.visits or self.visits[-1] != module:
            self.visits.append(module)
            resumed = " (R)" if _resumed(frame) else ""
            self.labels.append(f"{module}:{frame.f_code.co_qualname}{resumed}")


def _within(module: str, packages: frozenset[str]) -> bool:
    """``module`` is one of ``packages`` or inside one (``config.table`` inside ``config``)."""
    return module in packages or any(module.startswith(f"{p}.") for p in packages)


class Trace:
    """The ``moves`` method: the sequence of agentsafe modules execution passes through
    (consecutive repeats collapsed into one visit); the modules in ``transparent`` are not
    counted."""

    def __init__(self, transparent: frozenset[str] = frozenset()) -> None:
        self.visits: list[str] = []
        self.transparent = transparent
        self.pending: str | None = None

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if _resumed(frame):
                # A coroutine resumed: its whole await chain is re-entered, outermost first.
                # Execution is where the innermost agentsafe frame is; nothing moved before.
                module = _module(frame)
                if module is not None and module not in self.transparent:
                    self.pending = module
                return
            self._visit(_module(frame))
        elif event == "return":
            if _suspended(frame):
                return  # an await that suspends is no return to the awaiting module
            self._visit(_module(frame.f_back))

    def _visit(self, module: str | None) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._visit(pending)
        if module is None or module in self.transparent:
            return
        if not self.visits or self.visits[-1] != module:
            self.visits.append(module)


def _resumed(frame: FrameType) -> bool:
    """A coroutine (or generator) frame resumed after an ``await`` (``RESUME`` with a non-zero
    argument; 0 is a function's start)."""
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) - 1 and code[at] == _RESUME and code[at + 1] != 0


def _suspended(frame: FrameType) -> bool:
    """A ``return`` event that is a coroutine suspending at a ``YIELD_VALUE``."""
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) and code[at] == _YIELD_VALUE


_RESUME = dis.opmap["RESUME"]
_YIELD_VALUE = dis.opmap["YIELD_VALUE"]


def report(visits: list[str]) -> dict[str, Any]:
    seen: set[str] = set()
    returns = 0
    for index, module in enumerate(visits):
        if module in seen and index > 0:
            returns += 1
        seen.add(module)
    per_module = collections.Counter(visits)
    return {
        "modules": len(per_module),
        "moves": max(len(visits) - 1, 0),
        "returns": returns,
        "per_module": per_module,
        "pipeline_attempt": sum(
            n for m, n in per_module.items() if m in ("lifecycle.pipeline", "lifecycle.attempt")
        ),
        "seam_forward": sum(
            n for m, n in per_module.items() if m in ("dispatch.seam", "dispatch.forward")
        ),
        "plane_or_assembly": sorted(m for m in per_module if m in ("plane", "assembly")),
    }


METHODS = ("calls", "moves")


async def run(show_path: bool, method: str = "calls") -> dict[str, dict[str, Any]]:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    root = Path(tempfile.mkdtemp(prefix="agentsafe-request-path-"))
    provider = ProviderProcess(root)
    await provider.start()
    executor = None
    try:
        workspace = Workspace(root / "ws")
        env = workspace.environment(provider_url=provider.url, port=0)
        streams = Streams(evidence=DeferredSink(), security=DeferredSink())
        chain = (io.StringIO(), io.StringIO()) if method == "moves" else None
        executor = await assemble(env, streams=streams, chain=chain)
        await executor.reconcile_at_start()
        await executor.listen()
        url = f"http://127.0.0.1:{executor.port}/v1/actions"
        headers = {"authorization": f"Bearer {workspace.caller_token}"}

        def body(key: str) -> dict[str, Any]:
            return {
                "proposal": {
                    "action": "create_payout",
                    "target": "payout:beneficiary-1",
                    "parameters": {"currency": "USD", "amountMinor": 100},
                },
                "idempotency_key": key,
            }

        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body("warm"), headers=headers) as response:
                warm = await response.json()
            assert warm.get("outcome") == "COMPLETED", warm
            kind = CallTrace if method == "calls" else Trace
            every, wings = kind(), kind(transparent=ground_floor())

            def hook(frame: FrameType, event: str, arg: Any) -> None:
                every.hook(frame, event, arg)
                wings.hook(frame, event, arg)

            sys.setprofile(hook)
            try:
                async with session.post(url, json=body("traced"), headers=headers) as response:
                    answer = await response.json()
            finally:
                sys.setprofile(None)
        assert answer.get("outcome") == "COMPLETED", answer
    finally:
        if executor is not None:
            await executor.close()
        provider.terminate()
        shutil.rmtree(root, ignore_errors=True)
    if show_path:
        if isinstance(wings, CallTrace):  # one visit a line: its first frame, (R) if resumed
            print(
                "\n".join(f"{n:3} {label}" for n, label in enumerate(wings.labels, 1)), end="\n\n"
            )
        else:
            print(" -> ".join(wings.visits), end="\n\n")
    return {"wings": report(wings.visits), "every": report(every.visits)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="store_true", help="print the sequence of visits")
    parser.add_argument(
        "--method", choices=METHODS, default="calls", help="what counts (see the docstring)"
    )
    args = parser.parse_args()
    both = asyncio.run(run(args.path, args.method))
    for name, title in (
        ("wings", "the wings and the process (ground floor transparent)"),
        ("every", "every agentsafe module"),
    ):
        out = both[name]
        print(
            f"one ALLOW ({args.method}), {title}: {out['modules']} modules, {out['moves']} moves,"
            f" {out['returns']} returns to a module already left; pipeline+attempt"
            f" {out['pipeline_attempt']} visits; seam+forward {out['seam_forward']} visits;"
            f" plane/assembly entered:"
            f" {', '.join(out['plane_or_assembly']) or 'no'}"
        )
    print("\n| module | visits (wings) | visits (every module) |\n| --- | ---: | ---: |")
    for module, n in both["every"]["per_module"].most_common():
        print(f"| `{module}` | {both['wings']['per_module'].get(module, '-')} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
