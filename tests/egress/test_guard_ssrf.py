"""The SSRF corpus: every way to steer the guarded client somewhere it must not go is refused."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from agentsafe.executor.egress.guard import (
    METADATA_ADDRESSES,
    Destination,
    GuardedClient,
    address_refusal,
)
from agentsafe.executor.egress.transport import TransportError
from agentsafe.executor.events import MemorySink, Streams


@dataclass
class StandInDns:
    """Test stand-in for DNS: answers per name, consumed in order (rebinding), counting lookups."""

    answers: dict[str, list[list[str]]]
    lookups: list[str] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        queue = self.answers.get(host, [[]])
        return queue.pop(0) if len(queue) > 1 else queue[0]


def guard(
    destinations: list[Destination],
    dns: StandInDns | None = None,
    local: Sequence[str] = ("10.1.2.3",),
    allowed: Sequence[str] = ("10.0.0.0/8",),
) -> tuple[GuardedClient, MemorySink, list[str]]:
    """The bank's core API lives in 10.0.0.0/8, opened explicitly (EXECUTOR_EGRESS_ALLOW_CIDRS)."""
    streams = Streams.memory()
    counted: list[str] = []
    client = GuardedClient(
        destinations,
        streams,
        on_refusal=counted.append,
        resolve=dns or StandInDns({}),
        local_addresses=local,
        allowed_networks=allowed,
    )
    assert isinstance(streams.security, MemorySink)
    return client, streams.security, counted


API = Destination("https://api.bank.test/core/")

URL_CORPUS = [
    # other origins
    ("https://evil.test/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://api.bank.test:8443/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://api.bank.test.evil.test/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://localhost/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://localhost./core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://LOCALHOST./core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://api.bank.test./core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    # userinfo tricks
    ("https://api.bank.test@evil.test/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://evil.test@api.bank.test/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://user:pass@api.bank.test/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://:@api.bank.test/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    # schemes
    ("http://api.bank.test/core/x", "EGRESS_SCHEME_NOT_ALLOWED"),
    ("file:///etc/passwd", "EGRESS_INIT_UNSUPPORTED"),
    ("gopher://api.bank.test/core/x", "EGRESS_SCHEME_NOT_ALLOWED"),
    # numeric spellings of loopback and friends
    ("https://2130706433/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://0x7f000001/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://0x7f.0.0.1/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://0177.0.0.1/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://017700000001/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://127.1/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://127.0.1/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://[::ffff:127.0.0.1]/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://[::ffff:7f00:1]/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://[0:0:0:0:0:0:0:1]/core/x", "EGRESS_ADDRESS_REFUSED"),
    ("https://127.0.0.1/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    ("https://[::1]/core/x", "EGRESS_ORIGIN_NOT_ALLOWED"),
    # paths outside the prefix, however spelled
    ("https://api.bank.test/admin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/coreX/x", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/../admin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/%2e%2e/admin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/%2E%2E/admin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/.%2e/admin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/./x", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/..%2fadmin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core%2f..%2fadmin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/..%5cadmin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test/core/%252e%252e/admin", "EGRESS_PATH_NOT_ALLOWED"),
    ("https://api.bank.test//core/x", "EGRESS_PATH_NOT_ALLOWED"),
    # malformed
    ("https://api.bank.test\\@evil.test/core/x", "EGRESS_INIT_UNSUPPORTED"),
    ("https://api.bank.test/core/x y", "EGRESS_INIT_UNSUPPORTED"),
    ("https://api.bank.test/core/x\r\nHost: evil", "EGRESS_INIT_UNSUPPORTED"),
    ("/core/x", "EGRESS_INIT_UNSUPPORTED"),
]


@pytest.mark.parametrize(("url", "code"), URL_CORPUS)
async def test_url_corpus_refused_before_a_socket(url: str, code: str) -> None:
    dns = StandInDns({"api.bank.test": [["10.0.0.5"]]})
    client, sink, counted = guard([API], dns)
    with pytest.raises(TransportError) as info:
        await client.request("GET", url, headers={}, body=None, timeout=5)
    assert (info.value.code, info.value.sent) == (code, False)
    assert dns.lookups == []  # refused before even resolving
    assert counted == [code]
    [event] = sink.named("EGRESS_REFUSED")
    assert event["code"] == code
    assert "/core" not in event["origin"]
    assert "pass" not in event["origin"]


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        (["127.0.0.1"], "loopback"),
        (["127.8.9.10"], "loopback"),
        (["::1"], "loopback"),
        (["::ffff:127.0.0.1"], "loopback"),
        (["::127.0.0.1"], "loopback"),
        (["10.1.2.3"], "this host"),
        (["169.254.169.254"], "link-local"),
        (["fe80::1"], "link-local"),
        (["224.0.0.1"], "multicast"),
        (["ff02::1"], "multicast"),
        (["0.0.0.0"], "unspecified"),
        (["0.1.2.3"], "unspecified"),
        (["::"], "unspecified"),
        (["255.255.255.255"], "unspecified"),
        (["240.0.0.1"], "reserved"),
        ([], "nowhere"),
        (["10.0.0.5", "127.0.0.1"], "one bad answer among good"),
    ],
)
async def test_refused_answers(answers: list[str], reason: str) -> None:
    dns = StandInDns({"api.bank.test": [answers]})
    client, sink, _counted = guard([API], dns)
    with pytest.raises(TransportError) as info:
        await client.request(
            "GET", "https://api.bank.test/core/x", headers={}, body=None, timeout=5
        )
    assert (info.value.code, info.value.sent) == ("EGRESS_ADDRESS_REFUSED", False)
    assert dns.lookups == ["api.bank.test"]
    assert sink.named("EGRESS_REFUSED") == [
        {"origin": "https://api.bank.test:443", "code": "EGRESS_ADDRESS_REFUSED"}
    ]


# -- the IANA special-purpose registries and the metadata addresses (issue 16 item 14) -----

ISSUE_16 = [
    ("2002:7f00:1::", "6to4 of loopback"),  # 6to4 wrapping 127.0.0.1
    ("2002:a9fe:a9fe::", "6to4 of cloud metadata"),  # 6to4 wrapping 169.254.169.254
    ("fd00:ec2::254", "cloud metadata"),  # AWS IMDS over IPv6
    ("100.100.100.200", "cloud metadata"),  # Alibaba Cloud metadata
]

# One address inside every block of both registries (and multicast, broadcast, site-local).
EVERY_BLOCK = [
    ("0.1.2.3", "this network"),
    ("10.200.0.1", "private-use"),
    ("100.64.0.1", "shared address space"),
    ("127.8.9.10", "loopback"),
    ("169.254.1.1", "link-local"),
    ("172.16.3.4", "private-use"),
    ("192.0.0.8", "IETF protocol assignments"),
    ("192.0.2.1", "documentation"),
    ("192.31.196.1", "AS112"),
    ("192.52.193.1", "AMT"),
    ("192.88.99.1", "6to4 relay anycast"),
    ("192.168.1.1", "private-use"),
    ("192.175.48.1", "AS112 direct delegation"),
    ("198.19.0.1", "benchmarking"),
    ("198.51.100.1", "documentation"),
    ("203.0.113.1", "documentation"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "limited broadcast"),
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::ffff:192.168.0.1", "private-use"),  # IPv4-mapped: judged as the IPv4 address it is
    ("::ffff:8.8.8.8", None),
    ("64:ff9b::808:808", "NAT64"),
    ("64:ff9b::a9fe:a9fe", "NAT64 of cloud metadata"),
    ("64:ff9b:1::1", "local-use IPv4/IPv6 translation"),
    ("100::1", "discard-only"),
    ("100:0:0:1::1", "dummy prefix"),
    ("2001:2::1", "IETF protocol assignments"),
    ("2001:0:4136:e378:8000:63bf:3f57:fdf2", "Teredo"),  # whatever it carries
    ("2001:db8::1", "documentation"),
    ("2002:808:808::", "6to4"),
    ("2620:4f:8000::1", "AS112 direct delegation"),
    ("3fff::1", "documentation"),
    ("5f00::1", "SRv6 SIDs"),
    ("fd12:3456::1", "unique local"),
    ("fe80::1", "link-local"),
    ("fec0::1", "site-local (deprecated)"),
    ("ff02::1", "multicast"),
    ("8.8.8.8", None),
    ("2606:4700:4700::1111", None),
]


@pytest.mark.parametrize(("address", "reason"), ISSUE_16 + EVERY_BLOCK)
def test_every_special_purpose_block_is_refused(address: str, reason: str | None) -> None:
    found = address_refusal(address, allow_loopback=False)
    if reason is None:
        assert found is None
    else:
        assert found is not None, address
        assert found.startswith(reason), (address, found)


@pytest.mark.parametrize(("address", "_"), ISSUE_16)
async def test_the_issue_16_addresses_are_refused_as_dns_answers(address: str, _: str) -> None:
    """The addresses the review got through, as the answer for the destination's own name."""
    dns = StandInDns({"api.bank.test": [[address]]})
    client, sink, counted = guard([API], dns, allowed=("10.0.0.0/8", "fd00::/8", "100.64.0.0/10"))
    assert sink.named("EGRESS_REFUSED") == []
    with pytest.raises(TransportError) as info:
        await client.request(
            "GET", "https://api.bank.test/core/x", headers={}, body=None, timeout=5
        )
    assert (info.value.code, info.value.sent) == ("EGRESS_ADDRESS_REFUSED", False)
    assert counted == ["EGRESS_ADDRESS_REFUSED"]
    assert [e["code"] for e in sink.named("EGRESS_REFUSED")] == ["EGRESS_ADDRESS_REFUSED"]


def test_the_override_opens_only_the_private_parts_it_names() -> None:
    allowed = [ipaddress.ip_network(n) for n in ("10.96.0.0/12", "fd00:10::/32")]
    # a deliberate private destination, named
    for address in ("10.96.0.1", "10.111.255.254", "fd00:10::5", "::ffff:10.96.0.1"):
        assert address_refusal(address, allow_loopback=False, allowed=allowed) is None
    # the rest of the private blocks stays refused
    for address in ("10.0.0.5", "10.112.0.1", "192.168.1.1", "fd00:11::5"):
        assert address_refusal(address, allow_loopback=False, allowed=allowed) is not None


@pytest.mark.parametrize(
    "cidr", ["169.254.0.0/16", "127.0.0.0/8", "2002::/16", "64:ff9b::/96", "2001::/32"]
)
def test_the_override_never_opens_what_is_not_private_use(cidr: str) -> None:
    allowed = [ipaddress.ip_network(cidr)]
    inside = str(next(iter(ipaddress.ip_network(cidr).hosts())))
    assert address_refusal(inside, allow_loopback=False, allowed=allowed) is not None


@pytest.mark.parametrize("address", sorted(str(a) for a in METADATA_ADDRESSES))
def test_metadata_addresses_stay_refused_inside_an_opened_block(address: str) -> None:
    allowed = [ipaddress.ip_network(n) for n in ("100.64.0.0/10", "fc00::/7", "192.0.0.0/24")]
    assert address_refusal(address, allow_loopback=False, allowed=allowed) == "cloud metadata"
    assert address_refusal(address, allow_loopback=True, allowed=allowed) == "cloud metadata"


async def test_system_resolver_localhost_refused() -> None:
    client, _, _ = guard([Destination("https://localhost/")], dns=None)
    client.resolve = None
    with pytest.raises(TransportError) as info:
        await client.request("GET", "https://localhost/", headers={}, body=None, timeout=5)
    assert info.value.code == "EGRESS_ADDRESS_REFUSED"


async def test_rebinding_connects_to_the_first_checked_answer(
    listener: tuple[int, list[str]],
) -> None:
    """Checked answer loopback (allowed here), second answer the metadata address: one lookup."""
    port, hits = listener
    dns = StandInDns({"rebind.test": [["127.0.0.1"], ["169.254.169.254"]]})
    client, _, _ = guard(
        [Destination(f"http://rebind.test:{port}/", allow_insecure_loopback=True)], dns
    )
    response = await client.request(
        "GET", f"http://rebind.test:{port}/a", headers={}, body=None, timeout=5
    )
    assert response.body == b"reached"
    assert hits == ["/a"]
    assert dns.lookups == ["rebind.test"]


async def test_rebinding_private_then_loopback_never_reaches_loopback(
    listener: tuple[int, list[str]],
) -> None:
    port, hits = listener
    dns = StandInDns({"rebind.test": [["192.0.2.10"], ["127.0.0.1"]]})
    client, _, _ = guard([Destination(f"https://rebind.test:{port}/")], dns)
    with pytest.raises(TransportError) as info:
        await client.request(
            "GET", f"https://rebind.test:{port}/a", headers={}, body=None, timeout=0.5
        )
    # the checked answer (a documentation address) is refused before any socket; the second
    # answer, loopback, is never asked for
    assert info.value.code == "EGRESS_ADDRESS_REFUSED"
    assert info.value.sent is False
    assert hits == []
    assert dns.lookups == ["rebind.test"]


async def test_plain_http_needs_a_loopback_answer(listener: tuple[int, list[str]]) -> None:
    port, hits = listener
    dns = StandInDns({"dev.test": [["10.7.7.7"]]})  # opened by the override, but not loopback
    client, _, _ = guard(
        [Destination(f"http://dev.test:{port}/", allow_insecure_loopback=True)], dns
    )
    with pytest.raises(TransportError) as info:
        await client.request("GET", f"http://dev.test:{port}/", headers={}, body=None, timeout=5)
    assert (info.value.code, info.value.sent) == ("EGRESS_SCHEME_NOT_ALLOWED", False)
    assert hits == []


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("TRACE", {}),
        ("get", {}),
        ("GET", {"Host": "evil.test"}),
        ("GET", {"Transfer-Encoding": "chunked"}),
        ("GET", {"X-A": "v\r\nHost: evil"}),
        ("GET", {"Bad Name": "v"}),
        ("GET", {"X-A\n": "v"}),
        ("GET", {"X-A": "v\n"}),
    ],
)
async def test_request_shape_refused(method: str, headers: dict[str, str]) -> None:
    client, _, counted = guard([API], StandInDns({"api.bank.test": [["10.0.0.5"]]}))
    with pytest.raises(TransportError) as info:
        await client.request(
            method, "https://api.bank.test/core/x", headers=headers, body=None, timeout=5
        )
    assert (info.value.code, info.value.sent) == ("EGRESS_INIT_UNSUPPORTED", False)
    assert counted == ["EGRESS_INIT_UNSUPPORTED"]


@pytest.mark.parametrize(
    ("method", "url", "headers", "code"),
    [
        # the URL is checked first: its code wins over a bad method or header
        ("TRACE", "https://user:pass@api.bank.test/core/x", {}, "EGRESS_ORIGIN_NOT_ALLOWED"),
        ("GET", "ftp://api.bank.test/core/x", {"Host": "evil.test"}, "EGRESS_SCHEME_NOT_ALLOWED"),
        # then the method and the header fields, before the origin and the path
        ("TRACE", "https://evil.test/core/x", {}, "EGRESS_INIT_UNSUPPORTED"),
        ("GET", "https://api.bank.test/admin", {"Bad Name": "v"}, "EGRESS_INIT_UNSUPPORTED"),
        # then the origin, before the path
        ("GET", "https://evil.test/core/../x", {}, "EGRESS_ORIGIN_NOT_ALLOWED"),
    ],
)
async def test_the_first_failing_check_names_the_refusal(
    method: str, url: str, headers: dict[str, str], code: str
) -> None:
    """The checks before a name is resolved run in one order (docs/egress.md), so a request
    wrong in two ways is refused with the same code however the check is split up (issue 32
    moved it into egress/urls.py, one call per request)."""
    client, _, counted = guard([API], StandInDns({"api.bank.test": [["10.0.0.5"]]}))
    with pytest.raises(TransportError) as info:
        await client.request(method, url, headers=headers, body=None, timeout=5)
    assert (info.value.code, info.value.sent) == (code, False)
    assert counted == [code]
