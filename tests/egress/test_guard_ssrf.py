"""The SSRF corpus: every way to steer the guarded client somewhere it must not go is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from agentsafe.executor.egress.guard import Destination, GuardedClient, address_refusal
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


@pytest.fixture
async def listener() -> AsyncIterator[tuple[int, list[str]]]:
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="reached")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner.addresses[0][1], hits
    await runner.cleanup()


def guard(
    destinations: list[Destination],
    dns: StandInDns | None = None,
    local: Sequence[str] = ("10.1.2.3",),
) -> tuple[GuardedClient, MemorySink, list[str]]:
    streams = Streams.memory()
    counted: list[str] = []
    client = GuardedClient(
        destinations,
        streams,
        on_refusal=counted.append,
        resolve=dns or StandInDns({}),
        local_addresses=local,
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


def test_private_ranges_are_allowed() -> None:
    for address in ("10.0.0.5", "172.16.3.4", "192.168.1.1", "100.64.0.1", "fd00::1"):
        assert address_refusal(address, allow_loopback=False) is None


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
    # the checked private address is unreachable here: refused or timed out, never loopback.
    assert info.value.code in {"EGRESS_TIMEOUT", "TRANSPORT_CONNECT_FAILED"}
    assert info.value.sent is False
    assert hits == []
    assert dns.lookups == ["rebind.test"]


async def test_plain_http_needs_a_loopback_answer(listener: tuple[int, list[str]]) -> None:
    port, hits = listener
    dns = StandInDns({"dev.test": [["192.168.7.7"]]})
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
