"""The custom schemathesis check refuses what breaks the refusal contract (a check that never
fails would prove nothing): missing security headers, another shape, a status the registry does
not give the code, no Retry-After, an echo of what the request sent."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.api.st_hooks import SECURITY_HEADERS, refusal_contract, valid_is_read


@dataclass
class Operation:
    definition: Any = field(default_factory=lambda: type("D", (), {"raw": {}})())
    path: str = "/v1/actions"


@dataclass
class Mode:
    is_positive: bool = True


@dataclass
class Generation:
    mode: Mode = field(default_factory=Mode)


@dataclass
class Meta:
    generation: Generation = field(default_factory=Generation)


@dataclass
class Case:
    path: str = "/v1/actions"
    body: Any = None
    query: Any = None
    path_parameters: Any = None
    headers: Any = None
    operation: Operation = field(default_factory=Operation)
    meta: Meta | None = None


@dataclass
class Response:
    status_code: int
    body: Any
    extra_headers: dict[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, list[str]]:
        headers = {name: [value] for name, value in SECURITY_HEADERS.items()}
        headers.update({k: [v] for k, v in self.extra_headers.items()})
        return headers

    @property
    def content(self) -> bytes:
        return json.dumps(self.body).encode()


@pytest.fixture(autouse=True)
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = tmp_path / "openapi.json"
    document.write_text(json.dumps({"paths": {"/v1/actions": {"reason": "idempotency_key"}}}))
    monkeypatch.setenv("AGENTSAFE_API_SPEC", str(document))


def refusal(code: str, message: str = "refused") -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def check(response: Response, case: Case | None = None) -> None:
    refusal_contract(None, response, case or Case())


def test_a_refusal_that_keeps_the_contract_passes() -> None:
    check(Response(409, refusal("IDEMPOTENCY_KEY_CONFLICT")))
    check(Response(429, refusal("RATE_LIMITED"), {"Retry-After": "5"}))
    check(Response(200, {"anything": True}))
    blocked = {"verdict": "BLOCK", "executed": False, "fail_closed": True}
    check(Response(503, blocked))


@pytest.mark.parametrize(
    ("response", "why"),
    [
        (Response(409, {"error": "IDEMPOTENCY_KEY_CONFLICT"}), "exactly"),
        (Response(409, {**refusal("IDEMPOTENCY_KEY_CONFLICT"), "hint": 1}), "is not"),
        (Response(400, refusal("IDEMPOTENCY_KEY_CONFLICT")), "registry says 409"),
        (Response(409, refusal("idempotency conflict")), "UPPER_SNAKE"),
        (Response(409, refusal("IDEMPOTENCY_KEY_CONFLICT", " ")), "empty"),
        (Response(429, refusal("RATE_LIMITED")), "Retry-After"),
        (Response(503, refusal("STORE_UNAVAILABLE"), {"Retry-After": "soon"}), "Retry-After"),
        (Response(503, {"verdict": "ALLOW", "executed": True, "fail_closed": False}), "BLOCK"),
        (Response(503, {"status": "down"}), "neither"),
        (Response(409, {**refusal("IDEMPOTENCY_KEY_CONFLICT"), "receipt": {}}), "receipt"),
    ],
)
def test_a_broken_refusal_fails(response: Response, why: str) -> None:
    with pytest.raises(AssertionError, match=why):
        check(response)


def test_a_missing_security_header_fails() -> None:
    class Bare(Response):
        @property
        def headers(self) -> dict[str, list[str]]:
            return {"x-frame-options": ["DENY"]}

    with pytest.raises(AssertionError, match="content-security-policy"):
        check(Bare(200, {}))


def test_an_echo_of_the_request_fails_but_the_documents_own_words_do_not() -> None:
    case = Case(body={"proposal": {"target": "payout:acct-998877"}, "idempotency_key": "k"})
    with pytest.raises(AssertionError, match="echoes"):
        check(Response(400, refusal("REQUEST_INVALID", "bad target payout:acct-998877")), case)
    secret = Case(headers={"Authorization": "Bearer s3cr3t-token-value"})
    with pytest.raises(AssertionError, match="echoes"):
        check(Response(401, refusal("AUTH_FAILED", "s3cr3t-token-value is wrong")), secret)
    named = Case(body={"idempotency_key": "x" * 3})
    check(Response(400, refusal("REQUEST_INVALID", "the schema at 'idempotency_key'")), named)


def positive(path: str, *, is_positive: bool = True) -> Case:
    meta = Meta(Generation(Mode(is_positive)))
    return Case(path=path, operation=Operation(path=path), meta=meta)


@pytest.mark.parametrize(
    "path", ["/v1/actions", "/v1/escalations/cancel", "/v1/reconciliations", "/v1/plans/dry-run"]
)
def test_a_valid_body_refused_as_not_matching_the_schema_fails(path: str) -> None:
    """issue 31: the document must state what the server reads on these routes."""
    answer = Response(400, refusal("REQUEST_INVALID", "an integer is outside the exact range"))
    with pytest.raises(AssertionError, match="the document calls valid"):
        valid_is_read(None, answer, positive(path))


def test_other_refusals_and_negative_cases_pass_the_valid_body_check() -> None:
    invalid = Response(400, refusal("REQUEST_INVALID"))
    valid_is_read(None, invalid, positive("/v1/actions", is_positive=False))  # negative data
    valid_is_read(None, invalid, positive("/v1/control/approvers/x/enrolment-tokens"))
    valid_is_read(None, Response(400, refusal("PLAN_INVALID")), positive("/v1/plans/dry-run"))
    valid_is_read(
        None, Response(409, refusal("ESCALATION_BINDING_MISMATCH")), positive("/v1/escalations")
    )
