"""The gateway's held requests: expired holds are dropped and the number held is bounded."""

from __future__ import annotations

from agentsafe.executor.gateway.forward import MAX_HELD, Exchange, Exchanges


def _exchange() -> Exchange:
    return Exchange("DELETE", "/accounts/7", "", {}, b"")


def test_an_expired_hold_is_dropped_when_another_is_held() -> None:
    exchanges = Exchanges()
    exchanges.hold("old", _exchange(), until=100.0, now=50.0)
    exchanges.put("in-flight", _exchange())
    exchanges.hold("new", _exchange(), until=300.0, now=150.0)
    assert exchanges.get("old") is None, "its intent expired: nothing can resume it"
    assert exchanges.get("new") is not None
    assert exchanges.get("in-flight") is not None, "a request being answered is never dropped"


def test_past_the_bound_the_hold_expiring_soonest_is_dropped() -> None:
    exchanges = Exchanges()
    for n in range(MAX_HELD):
        exchanges.hold(f"k{n}", _exchange(), until=1000.0 + n, now=0.0)
    exchanges.hold("one-more", _exchange(), until=5000.0, now=0.0)
    assert len(exchanges) == MAX_HELD
    assert exchanges.get("k0") is None
    assert exchanges.get("k1") is not None
    assert exchanges.get("one-more") is not None
    exchanges.hold("k1", _exchange(), until=6000.0, now=0.0)  # held again: no eviction
    assert len(exchanges) == MAX_HELD
