"""The pure pieces of a halt: which switches hold a policy, the halt key, the endpoints.

``render/halt.py`` decides the durable halt key and ``control.py`` reads the executor endpoints
and builds the trust context; the handler tests drive them end to end against a TLS stand-in.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

from agentsafe.operator.control import Endpoint, executor_endpoints, trust_context
from agentsafe.operator.halt import halt_acknowledged
from agentsafe.operator.render import PolicyRef
from agentsafe.operator.render.halt import (
    halt_document,
    render_halt_configmap,
    switches_halting,
)
from tests.support.pki import TestCA

POLICY = PolicyRef("payouts", "payments", "uid-1")


def _switch(name: str, halted: bool, selector: dict[str, Any] | None = None, **meta: Any) -> Any:
    spec: dict[str, Any] = {"halted": halted, "policySelector": selector or {}}
    if halted:
        spec["reason"] = f"{name} says stop"
    return {"metadata": {"name": name, **meta}, "spec": spec}


def test_only_halted_live_valid_selecting_switches_hold_a_policy() -> None:
    switches = [
        _switch("b-all", True),
        _switch("a-team", True, {"matchLabels": {"team": "payments"}}),
        _switch("other-team", True, {"matchLabels": {"team": "cards"}}),
        _switch("released", False),
        _switch("going", True, deletionTimestamp="2026-01-01T00:00:00Z"),
        # Invalid (its own handler reports SpecInvalid): it halts nothing.
        {"metadata": {"name": "broken"}, "spec": {"halted": True, "surprise": 1}},
    ]
    assert switches_halting(switches, {"team": "payments"}) == [
        ("a-team", "a-team says stop"),
        ("b-all", "b-all says stop"),
    ]
    assert switches_halting(switches, None) == [("b-all", "b-all says stop")]


def test_the_halt_key_names_every_switch_or_is_absent() -> None:
    document = halt_document([("a", "one"), ("b", "two")])
    assert document is not None
    assert document.endswith("\n")
    assert json.loads(document) == {
        "haltedBy": [{"haltSwitch": "a", "reason": "one"}, {"haltSwitch": "b", "reason": "two"}]
    }
    assert halt_document([]) is None
    halted = render_halt_configmap(POLICY, document)
    assert halted["metadata"] == {"name": "payouts-executor-config", "namespace": "payments"}
    assert halted["data"] == {"halt": document}
    # Released: the field manager applies no key at all, which removes the one it owned.
    assert "data" not in render_halt_configmap(POLICY, None)


def test_every_executor_address_is_an_endpoint_ready_or_not() -> None:
    slices = [
        {
            "endpoints": [
                {
                    "addresses": ["10.0.0.2"],
                    "conditions": {"ready": False},
                    "targetRef": {"kind": "Pod", "name": "payouts-executor-1"},
                },
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": [], "targetRef": {"name": "payouts-executor-9"}},
            ]
        },
        {  # the same pod in a second slice (dual stack) counts once
            "endpoints": [{"addresses": ["fd00::2"], "targetRef": {"name": "payouts-executor-1"}}]
        },
    ]
    assert executor_endpoints(slices) == [
        Endpoint(pod="10.0.0.1", address="10.0.0.1", ready=True),
        Endpoint(pod="payouts-executor-1", address="10.0.0.2", ready=False),
    ]


def test_the_executor_certificate_is_pinned_when_no_ca_is_given() -> None:
    ca = TestCA()
    server = ca.issue_server(dns_names=("payouts-executor.payments.svc",), ips=())
    pinned = trust_context(ca_pem=None, certificate_pem=server.cert_pem.decode())
    assert pinned.verify_flags & ssl.VERIFY_X509_PARTIAL_CHAIN
    assert pinned.minimum_version == ssl.TLSVersion.TLSv1_2
    trusted = trust_context(ca_pem=ca.cert_pem.decode(), certificate_pem=None)
    assert not trusted.verify_flags & ssl.VERIFY_X509_PARTIAL_CHAIN
    assert trusted.verify_mode == ssl.CERT_REQUIRED
    assert trusted.check_hostname


def test_the_retry_timer_stops_once_every_pod_acknowledged_this_generation() -> None:
    def switch(generation: int, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "s", "generation": generation}, "status": status}

    acked = {"observedGeneration": 2, "pods": [{"policy": "p", "pod": "a", "acknowledged": True}]}
    assert halt_acknowledged(switch(2, acked))
    assert not halt_acknowledged(switch(3, acked))  # a new spec: call again
    waiting = {
        **acked,
        "pods": [*acked["pods"], {"policy": "p", "pod": "b", "acknowledged": False}],
    }
    assert not halt_acknowledged(switch(2, waiting))
    assert not halt_acknowledged(switch(1, {}))  # never enforced
