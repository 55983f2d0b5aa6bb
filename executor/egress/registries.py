"""The IANA special-purpose address registries as a table, and the verdict on one address.

Role: the declarative part of the egress guard (``egress/guard.py``): every block of the IANA
IPv4 and IPv6 Special-Purpose Address Registries (:data:`SPECIAL_PURPOSE_BLOCKS`), the clouds'
metadata addresses (:data:`METADATA_ADDRESSES`), and :func:`address_refusal`, which says why an
address may not be connected to. It opens no socket and imports nothing of agentsafe
(``tests/egress/test_guard_registries.py`` holds both registries as data and checks every
block is refused).

Callers: ``egress/guard.py`` (every resolved address, before a socket exists);
``egress/urls.py`` (a numeric host is judged as the address it is).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "METADATA_ADDRESSES",
    "SPECIAL_PURPOSE_BLOCKS",
    "Network",
    "address_refusal",
    "local_interface_addresses",
    "unwrap",
]

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def unwrap(ip: _Address) -> _Address:
    """The IPv4 address an IPv4-mapped or (deprecated) IPv4-compatible IPv6 address *is*."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _IPV4_COMPATIBLE and int(ip) > 1:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


@dataclass(frozen=True)
class _Block:
    network: Network
    name: str
    private: bool = False
    """A private-use block: ``EXECUTOR_EGRESS_ALLOW_CIDRS`` may open parts of it."""


def _blocks(*rows: tuple[str, str] | tuple[str, str, bool]) -> tuple[_Block, ...]:
    return tuple(
        _Block(ipaddress.ip_network(row[0]), row[1], bool(row[2]) if len(row) > 2 else False)
        for row in rows
    )


_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 (SIIT)
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
"""The only IPv6 space IANA allocates for global unicast (the IPv6 Address Space registry):
every address outside it is special, unassigned or reserved, and never a downstream."""

# The one table: every entry of the IANA IPv4 and IPv6 Special-Purpose Address Registries
# (RFC 6890 and its updates, as published in 2025), plus multicast, the limited broadcast, the
# deprecated site-local and IPv4-compatible blocks and RFC 2765's IPv4-translated block.
# ``tests/egress/test_guard_registries.py`` holds both registries as data and checks every
# block is refused. Why a table of our own rather than ``ipaddress``'s ``is_private`` /
# ``is_global``: those flags follow the registries only from CPython 3.11.10 / 3.12.4 (gh-113171)
# and this project supports 3.11.0 on; on an older interpreter they call 192.0.0.0/24 and the
# 3fff::/20 documentation block global. They still count, as a floor: whatever the running
# interpreter's ``ipaddress`` calls not global or reserved is refused too (a newer table can
# only add refusals), and IPv6 outside 2000::/3 (the IANA IPv6 Address Space registry's global
# unicast) is refused whatever it is. Entries the registries list as globally reachable (AS112,
# AMT, the anycast assignments) are refused as well: no executor's downstream lives there.
# Only the ``private`` blocks can be opened, address by address, with
# ``EXECUTOR_EGRESS_ALLOW_CIDRS``.
SPECIAL_PURPOSE_BLOCKS: tuple[_Block, ...] = _blocks(
    # IPv4
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private-use", True),
    ("100.64.0.0/10", "shared address space", True),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private-use", True),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.31.196.0/24", "AS112"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private-use", True),
    ("192.175.48.0/24", "AS112 direct delegation"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "limited broadcast"),
    ("240.0.0.0/4", "reserved"),
    # IPv6
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::ffff:0:0:0/96", "IPv4-translated"),
    ("64:ff9b::/96", "NAT64 translation"),
    ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy prefix"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001::/32", "Teredo"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "AS112 direct delegation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 SIDs"),
    ("fc00::/7", "unique local", True),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)

# The instance metadata and platform services of the clouds an executor runs on, refused even
# where EXECUTOR_EGRESS_ALLOW_CIDRS opens the block around them: AWS (IMDS, time sync, DNS, the
# ECS task endpoint), GCP, Azure (IMDS and the WireServer, a public address), Alibaba,
# Tencent, Oracle, OpenStack, DigitalOcean.
METADATA_ADDRESSES: frozenset[_Address] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.169.123",
        "169.254.169.253",
        "169.254.170.2",
        "169.254.170.23",
        "169.254.0.23",
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
        "fd00:ec2::254",
        "fd00:ec2::253",
        "fd00:ec2::123",
        "fd00:ec2::23",
    )
)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address a 6to4, Teredo, NAT64 or IPv4-translated (RFC 2765) address carries,
    and the form's name."""
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    if ip.teredo is not None:
        return "Teredo", ip.teredo[1]
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _IPV4_TRANSLATED:
        return "IPv4-translated", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _not_global(ip: _Address) -> str | None:
    """The floor under the table: IPv6 outside global unicast, or what the running
    interpreter's ``ipaddress`` calls reserved, multicast or not global."""
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST:
        return "outside IPv6 global unicast"
    if ip.is_reserved or ip.is_multicast or ip.is_unspecified or not ip.is_global:
        return "special purpose"
    return None


def address_refusal(
    address: str,
    *,
    allow_loopback: bool,
    local_addresses: frozenset[str] = frozenset(),
    allowed: Sequence[Network] = (),
) -> str | None:
    """Why ``address`` may not be connected to (a short reason), or None when it may.

    In order: a cloud metadata address (always); loopback (unless the destination allows it,
    ``allow_insecure_loopback``); this host's own addresses; an IPv6 form that carries an
    IPv4 address (6to4, Teredo, NAT64; IPv4-mapped and -compatible are judged as the IPv4
    address they are; RFC 2765's IPv4-translated too), named with what it carries;
    then every special-purpose block (:data:`SPECIAL_PURPOSE_BLOCKS`); then the floor: IPv6
    outside 2000::/3, and what ``ipaddress`` calls reserved or not global. A private-use block
    (RFC 1918, shared address space, unique local) is allowed only inside one of ``allowed``
    (``EXECUTOR_EGRESS_ALLOW_CIDRS``), the explicit override for a deliberate private
    destination; nothing else can be opened.
    """
    try:
        raw = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an address"
    ip = unwrap(raw)
    if ip in METADATA_ADDRESSES or raw in METADATA_ADDRESSES:
        return "cloud metadata"
    if ip.is_loopback:
        return None if allow_loopback else "loopback"
    if str(ip) in local_addresses:
        return "this host"
    if isinstance(ip, ipaddress.IPv6Address):
        carried = _embedded_ipv4(ip)
        if carried is not None:
            form, inner = carried
            inner_reason = address_refusal(
                str(inner), allow_loopback=False, local_addresses=local_addresses, allowed=()
            )
            return f"{form} of {inner_reason}" if inner_reason else form
    opened = any(ip.version == n.version and ip in n for n in allowed)
    for block in SPECIAL_PURPOSE_BLOCKS:
        if ip.version == block.network.version and ip in block.network:
            if block.private and opened:
                continue
            return block.name
    return None if opened else _not_global(ip)


def local_interface_addresses() -> frozenset[str]:
    """This host's own interface addresses (Linux ``/proc``; empty elsewhere)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for index, line in enumerate(lines):
            if "/32 host LOCAL" in line and index > 0:
                candidate = lines[index - 1].strip().lstrip("|-+ ").strip()
                with contextlib.suppress(ValueError):
                    found.add(str(ipaddress.IPv4Address(candidate)))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0] if line.split() else ""
            if len(raw) == 32:
                with contextlib.suppress(ValueError):
                    found.add(str(ipaddress.IPv6Address(int(raw, 16))))
    return frozenset(found)
