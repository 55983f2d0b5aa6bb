"""The egress guard's remembered pure checks (issue 34) answer what the checks compute.

``urls._non_canonical_numeric_memo`` is held to :func:`non_canonical_numeric`, and
``guard._address_refusal_memo`` to :func:`address_refusal`, called afresh each time (both
functions are unchanged: they are today's behaviour). ``guard._address_facts`` and
``guard._is_address`` are held to the code they replace in ``GuardedClient._resolve_once``,
kept here. Every memo is asked twice per input, and inputs that differ in one part of the key
only (the loopback allowance, this host's addresses, the opened networks) follow each other.
Two clients with different opened networks share the module's memo and still judge an address
each by its own networks, and a rebinding to a refused answer is refused after the first answer
was remembered as allowed.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsafe.executor.egress import guard as guard_module
from agentsafe.executor.egress import urls
from agentsafe.executor.egress.guard import Destination, GuardedClient, address_refusal
from agentsafe.executor.egress.registries import (
    METADATA_ADDRESSES,
    SPECIAL_PURPOSE_BLOCKS,
    unwrap,
)
from agentsafe.executor.egress.transport import TransportError
from agentsafe.executor.events import MemorySink, Streams


def _facts_as_before(chosen: str) -> tuple[str, int, bool]:
    """What ``_resolve_once`` computed from the chosen answer before issue 34."""
    ip = ipaddress.ip_address(chosen)
    return str(ip), ip.version, unwrap(ip).is_loopback


def _is_address_as_before(literal: str) -> bool:
    try:
        ipaddress.ip_address(literal)
    except ValueError:
        return False
    return True


_V4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
_V6 = st.integers(0, 2**128 - 1).map(lambda n: str(ipaddress.IPv6Address(n)))
_IN_BLOCKS = st.sampled_from(SPECIAL_PURPOSE_BLOCKS).flatmap(
    lambda block: st.integers(0, block.network.num_addresses - 1).map(
        lambda k: str(block.network.network_address + k)
    )
)
_KNOWN = st.sampled_from(
    [
        *(str(a) for a in METADATA_ADDRESSES),
        "127.0.0.1", "::1", "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::10.1.2.3", "::2",
        "10.1.2.3", "10.96.0.1", "192.168.1.1", "fd00:10::5", "2002:7f00:1::", "64:ff9b::a9fe:a9fe",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2", "8.8.8.8", "2606:4700::1111", "fe80::1%eth0",
        "8.8.8.8%1", "", "not an address", "127.1", "0x7f.0.0.1", "::ffff:0:a9fe:a9fe", "1.2.3",
    ]
)  # fmt: skip
_ADDRESSES = st.one_of(_V4, _V6, _IN_BLOCKS, _KNOWN, st.text(max_size=12))
_LOCALS = st.sampled_from([frozenset(), frozenset({"10.1.2.3"}), frozenset({"10.1.2.3", "::1"})])
_NETWORKS = st.sampled_from(
    [
        (),
        (ipaddress.ip_network("10.0.0.0/8"),),
        (ipaddress.ip_network("10.96.0.0/12"), ipaddress.ip_network("fd00:10::/32")),
        (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("fc00::/7")),
    ]
)
_QUESTION = st.tuples(_ADDRESSES, st.booleans(), _LOCALS, _NETWORKS)


@settings(max_examples=300, deadline=None)
@given(st.lists(_QUESTION, min_size=1, max_size=12))
def test_the_remembered_refusal_is_the_refusal(questions: list[tuple[object, ...]]) -> None:
    for address, allow_loopback, local, allowed in questions:
        assert isinstance(address, str)
        assert isinstance(allow_loopback, bool)
        assert isinstance(local, frozenset)
        assert isinstance(allowed, tuple)
        # the question, then the same address with each other part of the key changed
        for loopback, here, opened in (
            (allow_loopback, local, allowed),
            (not allow_loopback, local, allowed),
            (allow_loopback, frozenset({address}), allowed),
            (allow_loopback, local, ()),
            (allow_loopback, local, (ipaddress.ip_network("0.0.0.0/0"),)),
            (allow_loopback, local, allowed),
        ):
            expected = address_refusal(
                address, allow_loopback=loopback, local_addresses=here, allowed=opened
            )
            assert (
                guard_module._address_refusal_memo(address, loopback, here, opened) == expected
            ), (address, loopback, here, opened)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ADDRESSES, min_size=1, max_size=12))
def test_the_remembered_facts_and_hosts_are_what_ipaddress_says(addresses: list[str]) -> None:
    for address in addresses:
        for _ in range(2):
            assert guard_module._is_address(address) == _is_address_as_before(address)
            assert urls._non_canonical_numeric_memo(address) == urls.non_canonical_numeric(address)
            assert urls._non_canonical_numeric_memo(address.lower()) == (
                urls.non_canonical_numeric(address.lower())
            )
            if _is_address_as_before(address):
                assert guard_module._address_facts(address) == _facts_as_before(address)
            else:
                with pytest.raises(ValueError):
                    guard_module._address_facts(address)


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1", "127.1", "2130706433", "0x7f.1", "0177.0.0.1", "::ffff:127.0.0.1",
        "0:0:0:0:0:0:0:1", "::1", "api.bank.test", "1.2.3.4.", "1.2.3.04", "10.0.0.256",
    ],
)  # fmt: skip
def test_a_non_canonical_numeric_host_is_refused_as_before(host: str) -> None:
    for _ in range(2):
        assert urls._non_canonical_numeric_memo(host) == urls.non_canonical_numeric(host)


def test_the_memos_are_bounded() -> None:
    for memo in (
        guard_module._address_refusal_memo,
        guard_module._address_facts,
        guard_module._is_address,
        urls._non_canonical_numeric_memo,
    ):
        assert memo.cache_info().maxsize is not None


@dataclass
class _Dns:
    answers: list[list[str]]
    lookups: list[str] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _client(dns: _Dns, allowed: Sequence[str], destination: Destination) -> GuardedClient:
    return GuardedClient(
        [destination],
        Streams.memory(),
        resolve=dns,
        local_addresses=("10.1.2.3",),
        allowed_networks=allowed,
    )


async def test_two_clients_judge_one_address_each_by_its_own_opened_networks() -> None:
    api = Destination("https://core.bank.test/")
    opened = _client(_Dns([["10.96.0.1"]]), ("10.96.0.0/12",), api)
    closed = _client(_Dns([["10.96.0.1"]]), (), api)
    rule = opened._rules[0]
    answer = await opened._resolve_once(None, rule)  # type: ignore[arg-type]
    assert (answer.ip, answer.family) == ("10.96.0.1", socket.AF_INET)
    with pytest.raises(Exception) as info:
        await closed._resolve_once(None, closed._rules[0])  # type: ignore[arg-type]
    assert getattr(info.value, "code", None) == "EGRESS_ADDRESS_REFUSED"
    assert getattr(info.value, "extra", None) == {"reason": "private-use"}
    await opened.close()
    await closed.close()


async def test_a_rebinding_after_a_remembered_answer_is_judged_afresh(
    listener: tuple[int, list[str]],
) -> None:
    port, hits = listener
    dns = _Dns([["127.0.0.1"], ["169.254.169.254"], ["127.0.0.1"]])
    client = _client(
        dns, (), Destination(f"http://rebind.test:{port}/", allow_insecure_loopback=True)
    )
    try:
        first = await client.request(
            "GET", f"http://rebind.test:{port}/a", headers={}, body=None, timeout=5
        )
        assert first.body == b"reached"
        with pytest.raises(TransportError) as info:
            await client.request(
                "GET", f"http://rebind.test:{port}/b", headers={}, body=None, timeout=5
            )
        assert (info.value.code, info.value.sent) == ("EGRESS_ADDRESS_REFUSED", False)
        again = await client.request(
            "GET", f"http://rebind.test:{port}/c", headers={}, body=None, timeout=5
        )
        assert again.body == b"reached"
        assert dns.lookups == ["rebind.test"] * 3  # resolved once per request, every request
        assert hits == ["/a", "/c"]  # the refused rebinding never reached the server
    finally:
        await client.close()


# -- the remembered URL check (issue 32) ---------------------------------------------------------

_URLS = [
    "https://core.bank.test/api/payouts",
    "https://core.bank.test/api/",
    "https://core.bank.test/other",
    "https://core.bank.test/api/../admin",
    "https://core.bank.test/api/a%2fb",
    "https://core.bank.test:8443/api/x",
    "https://user:pw@core.bank.test/api/x",
    "http://core.bank.test/api/x",
    "https://evil.test/api/x",
    "https://0x7f.0.0.1/api/x",
    "ftp://core.bank.test/api/x",
    "not a url",
    "/api/relative",
]
_NAMES = ["content-type", "idempotency-key", "x-api-key", "Host", "transfer-encoding", "bad name"]
_VALUES = ["application/json", "k-1", "tab\there", "nl\nhere", "\x00", "obs\x80text"]


def _refusal_of_the_whole_check(
    client: GuardedClient, method: str, url: str, headers: dict[str, str]
) -> str | None:
    try:
        urls.check_request(client._rules, method, url, headers)
    except urls._Refusal as refusal:
        return refusal.code
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["GET", "POST", "TRACE", "get"]),
            st.sampled_from(_URLS),
            st.dictionaries(st.sampled_from(_NAMES), st.sampled_from(_VALUES), max_size=3),
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_the_remembered_check_refuses_what_the_whole_check_refuses(
    requests: list[tuple[str, str, dict[str, str]]],
) -> None:
    """Each request twice (the second finds what the first remembered): refused with the whole
    check's first refusal and the origin ``safe_origin`` reports, or passed on to resolution
    (the stand-in DNS has no answer, so it ends EGRESS_ADDRESS_REFUSED after one lookup)."""
    dns = _Dns([[]])
    streams = Streams.memory()
    client = GuardedClient(
        [Destination("https://core.bank.test/api/")],
        streams,
        resolve=dns,
        local_addresses=("10.1.2.3",),
    )
    security = streams.security
    assert isinstance(security, MemorySink)
    try:
        for method, url, headers in requests:
            expected = _refusal_of_the_whole_check(client, method, url, headers)
            for _ in range(2):
                lookups = len(dns.lookups)
                with pytest.raises(TransportError) as info:
                    await client.request(method, url, headers=headers, body=None, timeout=5)
                refused = security.named("EGRESS_REFUSED")[-1]
                if expected is None:
                    assert (info.value.code, len(dns.lookups)) == (
                        "EGRESS_ADDRESS_REFUSED",
                        lookups + 1,
                    )
                else:
                    assert (info.value.code, len(dns.lookups)) == (expected, lookups)
                    assert refused == {"origin": urls.safe_origin(url), "code": expected}
    finally:
        await client.close()
