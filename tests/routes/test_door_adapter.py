"""The HTTP door's remembered source keys are door.source_key's, for every address text."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.door.door import source_key
from agentsafe.executor.routes.door import remembered_source_key

_ADDRESSES = (
    st.ip_addresses().map(str)
    | st.ip_addresses(v=6).map(lambda ip: f"{ip}%eth0")
    | st.integers(0, 2**32 - 1).map(lambda n: f"::ffff:{ipaddress.IPv4Address(n)}")
    | st.text(max_size=20)
    | st.none()
)


@given(st.lists(_ADDRESSES, max_size=20))
def test_a_remembered_key_is_the_key(addresses: list[str | None]) -> None:
    for address in addresses + addresses:  # each a second time: answered from memory
        assert remembered_source_key(address) == source_key(address)
