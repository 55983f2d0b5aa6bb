"""Host ceilings: the most this host lets pass, whatever the policy allows.

``EXECUTOR_HARD_LIMIT_SINGLE_MINOR`` (``CHF:2500000000,EUR:1000000``) bounds one action per ISO 4217
code in minor units; ``EXECUTOR_HARD_LIMIT_WINDOW_SECONDS`` with ``_WINDOW_COUNT`` and/or
``_WINDOW_SUM_MINOR`` bound how many actions, and how much value, pass in a sliding window.
Ceilings only ever refuse; every refusal is ``RequestRejected(code)`` (422) with one of
HARD_LIMIT_EXCEEDED, HARD_LIMIT_CURRENCY_UNKNOWN, HARD_LIMIT_AMOUNT_INVALID,
HARD_LIMIT_WINDOW_COUNT_EXCEEDED, HARD_LIMIT_WINDOW_SUM_EXCEEDED.

The amount is read from the intent's parameters, or from the projection a family derives from
its own action (``Registry.admit``: the banking family's amounts are strings of digits beyond
2^53 and arrive here as integers): an integer ``amountMinor`` (not a boolean, ``>= 0``) and a
three-letter upper-case ``currency`` that the ``iso4217`` data package lists (else
HARD_LIMIT_CURRENCY_UNKNOWN). Neither present: not a payment, bounded by
the count window alone. One without the other, or either malformed: HARD_LIMIT_AMOUNT_INVALID.
A currency the single-limit configuration never named: HARD_LIMIT_CURRENCY_UNKNOWN (only when
single limits are configured at all). A host with no ceiling configured refuses nothing.

Decisions this module makes, stated plainly:

* **The window sum is one total across currencies**, in minor units as given. Summing ``100`` yen
  and ``100`` cents is unit-mixing, but it is the only reading of a single
  ``_WINDOW_SUM_MINOR`` that never widens: a per-currency sum would let N currencies move N times
  the bound. Operators running several currencies should set the bound for the smallest unit they
  care about; the per-currency bound is ``EXECUTOR_HARD_LIMIT_SINGLE_MINOR``.
* **Where the window lives** is a :class:`CeilingWindow`. Embedded (:class:`MemoryWindow`) it is
  process memory on the monotonic clock: a restart forgets it, and changing the wall clock cannot
  reopen it. With a shared store (``EXECUTOR_STORE_URL``) it is ``state/pgstore.py``'s
  ``PostgresWindow``, on the database's clock and locked per reservation, so N allowed means N in
  total across every replica. It is a backstop against a policy mistake, not a treasury control.
* :meth:`HostCeilings.check` runs before the authority and reserves nothing;
  :meth:`HostCeilings.commit` runs after an ALLOW and before the grant is claimed, re-checks and
  reserves atomically (one lock, or one row lock), so racing requests cannot cross the window.
* A :class:`Reservation` may be released (idempotently) when the executor *knows* nothing was
  dispatched: the claim was refused, the journal refused, the handler failed before dispatch.
  Anything dispatched, including a provider's refusal or an unknown outcome, keeps its place:
  unknown may have moved value, and a refusal still consumed an attempt.

Every refusal is also one CEILING_REFUSED evidence line and one
``agentsafe_ceiling_refusals_total{code}`` count (the pipeline's and the attempt's, which know
the intent).

Callers: ``lifecycle/pipeline.py`` (check), ``lifecycle/attempt.py`` (commit, release),
``assembly.py`` (builds it from the configuration, with the shared window when there is a shared
store).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..clock import Clock
from ..codes import Code
from ..config import CURRENCY_PATTERN, iso4217_listed
from ..errors import RequestRejected
from ..windows import ceiling_verdict

__all__ = [
    "CeilingWindow",
    "HostCeilings",
    "MemoryWindow",
    "Payment",
    "Reservation",
    "read_payment",
]

_CURRENCY = re.compile(CURRENCY_PATTERN)


@dataclass(frozen=True)
class Payment:
    amount_minor: int
    currency: str


def _refuse(code: Code, message: str) -> RequestRejected:
    return RequestRejected(code, message)


def read_payment(parameters: Mapping[str, Any]) -> Payment | None:
    """The payment an action carries, ``None`` for none; a half or malformed one is refused."""
    has_amount = "amountMinor" in parameters
    has_currency = "currency" in parameters
    if not has_amount and not has_currency:
        return None
    if not (has_amount and has_currency):
        raise _refuse(
            Code.HARD_LIMIT_AMOUNT_INVALID, "an amount needs both amountMinor and currency"
        )
    amount = parameters["amountMinor"]
    currency = parameters["currency"]
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
        raise _refuse(Code.HARD_LIMIT_AMOUNT_INVALID, "amountMinor must be a non-negative integer")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise _refuse(
            Code.HARD_LIMIT_AMOUNT_INVALID, "currency must be a three-letter ISO 4217 code"
        )
    if not iso4217_listed(currency):
        raise _refuse(Code.HARD_LIMIT_CURRENCY_UNKNOWN, "ISO 4217 does not list this currency")
    return Payment(amount_minor=amount, currency=currency)


class CeilingWindow(Protocol):
    """Where the sliding window's reservations live (process memory, or the shared store)."""

    async def usage(self, window_seconds: float) -> tuple[int, int]:
        """``(count, sum_minor)`` inside the window now."""
        ...

    async def reserve(
        self,
        *,
        window_seconds: float,
        amount_minor: int,
        count_limit: int | None,
        sum_limit: int | None,
    ) -> tuple[str | None, object]:
        """Atomically re-check and take a place: ``(None, token)``, or ``("COUNT" | "SUM",
        None)`` naming the bound that is full."""
        ...

    async def release(self, token: object) -> None: ...


class MemoryWindow:
    """The embedded window: this process's memory on the monotonic clock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[int, tuple[float, int]] = {}  # insertion order is time order
        self._ids = itertools.count()
        self._sum = 0
        self._lock = asyncio.Lock()

    async def usage(self, window_seconds: float) -> tuple[int, int]:
        self._expire(window_seconds)
        return len(self._entries), self._sum

    async def reserve(
        self,
        *,
        window_seconds: float,
        amount_minor: int,
        count_limit: int | None,
        sum_limit: int | None,
    ) -> tuple[str | None, object]:
        async with self._lock:
            self._expire(window_seconds)
            full = ceiling_verdict(
                len(self._entries), self._sum, amount_minor, count_limit, sum_limit
            )
            if full is not None:
                return full, None
            token = next(self._ids)
            self._entries[token] = (self._clock.monotonic(), amount_minor)
            self._sum += amount_minor
            return None, token

    async def release(self, token: object) -> None:
        entry = self._entries.pop(token, None) if isinstance(token, int) else None
        if entry is not None:  # otherwise it already expired out of the window
            self._sum -= entry[1]

    def _expire(self, window_seconds: float) -> None:
        horizon = self._clock.monotonic() - window_seconds
        for token, (at, amount) in list(self._entries.items()):
            if at > horizon:
                break
            del self._entries[token]
            self._sum -= amount


class Reservation:
    """A place in the window taken by :meth:`HostCeilings.commit`."""

    def __init__(self, window: CeilingWindow | None, token: object = None) -> None:
        self._window = window
        self._token = token

    @property
    def released(self) -> bool:
        return self._window is None

    async def release(self) -> None:
        """Give the place back (nothing was dispatched). Releasing twice is harmless."""
        window, token = self._window, self._token
        self._window = self._token = None
        if window is not None:
            await window.release(token)


class HostCeilings:
    """The configured ceilings and the sliding window (see the module docstring)."""

    def __init__(
        self,
        *,
        single: Mapping[str, int] | None = None,
        window_seconds: float | None = None,
        window_count: int | None = None,
        window_sum_minor: int | None = None,
        clock: Clock,
        window: CeilingWindow | None = None,
    ) -> None:
        if (window_count is not None or window_sum_minor is not None) and not window_seconds:
            raise ValueError("a window count or sum needs window_seconds")
        if window_seconds is not None and window_seconds <= 0:
            raise ValueError("window_seconds must be positive")
        for value in (window_count, window_sum_minor, *(single or {}).values()):
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError("ceilings are non-negative integers")
        self._single = dict(single or {})
        self._window_seconds = window_seconds
        self._window_count = window_count
        self._window_sum = window_sum_minor
        self._window: CeilingWindow = window if window is not None else MemoryWindow(clock)

    @property
    def configured(self) -> bool:
        return bool(self._single) or self._window_count is not None or self._window_sum is not None

    async def check(self, parameters: Mapping[str, Any]) -> None:
        """Refuse what would not pass now; reserves nothing (before the authority is asked)."""
        payment = self._single_check(parameters)
        if self._window_seconds is None:
            return
        count, total = await self._window.usage(self._window_seconds)
        amount = payment.amount_minor if payment else 0
        if self._window_count is not None and count + 1 > self._window_count:
            raise _full("COUNT")
        if self._window_sum is not None and total + amount > self._window_sum:
            raise _full("SUM")

    async def commit(self, parameters: Mapping[str, Any]) -> Reservation:
        """Re-check and take a place in the window atomically (after ALLOW, before the claim)."""
        payment = self._single_check(parameters)
        if self._window_seconds is None:
            return Reservation(None)
        full, token = await self._window.reserve(
            window_seconds=self._window_seconds,
            amount_minor=payment.amount_minor if payment else 0,
            count_limit=self._window_count,
            sum_limit=self._window_sum,
        )
        if full is not None:
            raise _full(full)
        return Reservation(self._window, token)

    async def window_usage(self) -> tuple[int, int]:
        """``(count, sum_minor)`` currently inside the window."""
        if self._window_seconds is None:
            return 0, 0
        return await self._window.usage(self._window_seconds)

    def _single_check(self, parameters: Mapping[str, Any]) -> Payment | None:
        if not self.configured:
            return None  # no ceiling exists to refuse on this host's behalf
        payment = read_payment(parameters)
        if payment is None or not self._single:
            return payment
        limit = self._single.get(payment.currency)
        if limit is None:
            raise _refuse(
                Code.HARD_LIMIT_CURRENCY_UNKNOWN, "this host names no limit for the currency"
            )
        if payment.amount_minor > limit:
            raise _refuse(Code.HARD_LIMIT_EXCEEDED, "the amount is above this host's single limit")
        return payment


def _full(which: str) -> RequestRejected:
    if which == "COUNT":
        return _refuse(
            Code.HARD_LIMIT_WINDOW_COUNT_EXCEEDED, "this host's action count window is full"
        )
    return _refuse(Code.HARD_LIMIT_WINDOW_SUM_EXCEEDED, "this host's value window is full")
