"""Cancellation: an optional abort event checked before validation, raced against every
awaited host callback, and checked again before a value is returned.

Asyncio cancellation needs nothing extra: ``CancelledError`` propagates through every await.
An abort :class:`asyncio.Event` is turned into :class:`AgentSafetyAborted`; a callback still
running when it fires is cancelled and awaited, so it never outlives the operation.

Callers: ``approval.py``, ``receipts.py``, ``execute.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..codes import Code
from .errors import AgentSafetyAborted, AgentSafetyError

__all__ = ["capture_abort", "check_abort", "guarded"]

_T = TypeVar("_T")


def capture_abort(cancel: object) -> asyncio.Event | None:
    if cancel is None:
        return None
    if not isinstance(cancel, asyncio.Event):
        raise AgentSafetyError("cancel must be an asyncio.Event", code=Code.CANCEL_INVALID)
    return cancel


def check_abort(abort: asyncio.Event | None) -> None:
    if abort is not None and abort.is_set():
        raise AgentSafetyAborted("the operation was aborted")


async def _settle(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            with contextlib.suppress(BaseException):
                task.exception()


async def guarded(call: Callable[[], Awaitable[_T]], abort: asyncio.Event | None) -> _T:
    """Await ``call()`` unless ``abort`` is (or becomes) set; then check ``abort`` again."""
    check_abort(abort)
    if abort is None:
        result = await call()
    else:
        task: asyncio.Future[_T] = asyncio.ensure_future(call())
        waiter: asyncio.Future[Any] = asyncio.ensure_future(abort.wait())
        pending: set[asyncio.Future[Any]] = {task, waiter}
        try:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await asyncio.shield(_settle(task, waiter))
            raise
        if not task.done():
            await _settle(task, waiter)
            raise AgentSafetyAborted("the operation was aborted")
        await _settle(waiter)
        result = task.result()
    check_abort(abort)
    return result
