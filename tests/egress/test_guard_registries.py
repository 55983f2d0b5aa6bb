"""Every block of both IANA Special-Purpose Address Registries is refused by the egress guard.

The registries are embedded here as data, transcribed from IANA's pages as published in 2025:
"IANA IPv4 Special-Purpose Address Registry" (iana-ipv4-special-registry) and "IANA IPv6
Special-Purpose Address Registry" (iana-ipv6-special-registry), both maintained under RFC 6890
and its updates. Each block's first address, last address and one in the middle must be refused
by ``address_refusal`` (with nothing opened by ``EXECUTOR_EGRESS_ALLOW_CIDRS``), whether the
registry calls it globally reachable or not: no executor's downstream lives in any of them.
Issue 30, item 19 adds the IPv4-translated forms (RFC 2765) and unallocated IPv6 space.
"""

from __future__ import annotations

import ipaddress

import pytest

from agentsafe.executor.egress.guard import address_refusal

# (address block, name) as the registry lists them.
IANA_IPV4_SPECIAL_PURPOSE = [
    ("0.0.0.0/8", "This network"),
    ("0.0.0.0/32", "This host on this network"),
    ("10.0.0.0/8", "Private-Use"),
    ("100.64.0.0/10", "Shared Address Space"),
    ("127.0.0.0/8", "Loopback"),
    ("169.254.0.0/16", "Link Local"),
    ("172.16.0.0/12", "Private-Use"),
    ("192.0.0.0/24", "IETF Protocol Assignments"),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix"),
    ("192.0.0.8/32", "IPv4 dummy address"),
    ("192.0.0.9/32", "Port Control Protocol Anycast"),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast"),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery"),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery"),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)"),
    ("192.31.196.0/24", "AS112-v4"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)"),
    ("192.88.99.2/32", "6a44-relay anycast address"),
    ("192.168.0.0/16", "Private-Use"),
    ("192.175.48.0/24", "Direct Delegation AS112 Service"),
    ("198.18.0.0/15", "Benchmarking"),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)"),
    ("240.0.0.0/4", "Reserved"),
    ("255.255.255.255/32", "Limited Broadcast"),
]

IANA_IPV6_SPECIAL_PURPOSE = [
    ("::1/128", "Loopback Address"),
    ("::/128", "Unspecified Address"),
    ("::ffff:0:0/96", "IPv4-mapped Address"),
    ("64:ff9b::/96", "IPv4-IPv6 Translat."),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat."),
    ("100::/64", "Discard-Only Address Block"),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix"),
    ("2001::/23", "IETF Protocol Assignments"),
    ("2001::/32", "TEREDO"),
    ("2001:1::1/128", "Port Control Protocol Anycast"),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast"),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast"),
    ("2001:2::/48", "Benchmarking"),
    ("2001:3::/32", "AMT"),
    ("2001:4:112::/48", "AS112-v6"),
    ("2001:10::/28", "Deprecated (previously ORCHID)"),
    ("2001:20::/28", "ORCHIDv2"),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix"),
    ("2001:db8::/32", "Documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service"),
    ("3fff::/20", "Documentation"),
    ("5f00::/16", "Segment Routing (SRv6) SIDs"),
    ("fc00::/7", "Unique-Local"),
    ("fe80::/10", "Link-Local Unicast"),
]


def _samples(block: str) -> list[str]:
    network = ipaddress.ip_network(block)
    first, last = int(network.network_address), int(network.broadcast_address)
    kind = type(network.network_address)
    return sorted({str(kind(first)), str(kind(last)), str(kind((first + last) // 2))})


@pytest.mark.parametrize(("block", "name"), IANA_IPV4_SPECIAL_PURPOSE + IANA_IPV6_SPECIAL_PURPOSE)
def test_every_registry_block_is_refused(block: str, name: str) -> None:
    for address in _samples(block):
        assert address_refusal(address, allow_loopback=False) is not None, (block, name, address)


@pytest.mark.parametrize(
    ("address", "carried"),
    [
        ("::ffff:0:127.0.0.1", "loopback"),
        ("::ffff:0:169.254.169.254", "cloud metadata"),
        ("::ffff:0:10.0.0.1", "private-use"),
        ("::ffff:0:8.8.8.8", None),
    ],
)
def test_ipv4_translated_addresses_are_refused_with_what_they_carry(
    address: str, carried: str | None
) -> None:
    """RFC 2765's IPv4-translated form (``::ffff:0:a.b.c.d``) reaches the IPv4 address behind
    a translator: refused, named with what it carries (issue 30, item 19)."""
    found = address_refusal(address, allow_loopback=True)
    assert found is not None
    assert found.startswith("IPv4-translated")
    if carried is not None:
        assert found == f"IPv4-translated of {carried}"


@pytest.mark.parametrize("address", ["::1:2:3", "::2:0:0:1", "1fff:ffff::1", "4000::1", "e000::1"])
def test_ipv6_outside_global_unicast_is_refused(address: str) -> None:
    """IANA's IPv6 Address Space registry allocates only 2000::/3 for global unicast."""
    assert address_refusal(address, allow_loopback=False) == "outside IPv6 global unicast"


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450::1"])
def test_public_addresses_still_pass(address: str) -> None:
    assert address_refusal(address, allow_loopback=False) is None
