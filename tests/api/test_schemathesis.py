"""schemathesis against a real ``agentsafe serve`` (issue 23): ``make api-test``.

One executor process with every optional section on (a ``plans`` section in its policy,
``EXECUTOR_ESCALATION=APPROVAL``), a principals file with a PROPOSER, two APPROVERs and an
OPERATOR holding every scope but ``approvers`` and one holding that scope, a plan step executor
registered the way an adopter's package does (``tests/api/st_plan_host.py``), and the synthetic
provider behind it. The test reads the OpenAPI document the executor serves to its OPERATOR
(``GET /v1/control/openapi.json``), checks it is the document ``docs/openapi.json`` holds for
those routes, seeds pending approval requests (proposals the example policy escalates) and the
valid bodies chains start from (``tests/api/st_hooks.py``: a proposal that escalates, an
escalation, a plan of the proposer's, an approval request, a step), and runs ``st`` on it with
every standard check (``--checks all``: no 500,
status codes, content types, headers and bodies conform to the document, negative data is
refused, auth is not ignored, unsupported methods answer 405, ...) and the custom refusal
contract (``tests/api/st_hooks.py``); each operation is called as a principal of the role (and
scope) it names:

1. the examples, coverage and fuzzing phases, one operation at a time;
2. rounds of the stateful phase (seeds 0, 1, ...), each after a resume (the first phases halt the
   executor on purpose) and with fresh pending requests: chains of calls that follow the
   document's links, until EVERY link of the document was followed at least once (read from
   each round's NDJSON event stream; ``API_TEST_ROUNDS`` rounds at most): the
   catalog to a proposal, an escalated proposal to its review, decision, cancellations and its
   presentation back, a listing to each request, a plan's dry run to its approval to its step to
   the step's receipt verification, and an execution to the evidence export.

The door's shared window for unauthenticated attempts, its lockout and the halt on a spike of
authentication failures are widened for the run (``EXECUTOR_RATE_LIMIT_UNAUTHENTICATED``,
``EXECUTOR_AUTH_LOCKOUT``, ``EXECUTOR_HALT_ON_AUTH_FAILURES``): schemathesis sends thousands of
credential-less requests on purpose, and a locked or halted door would hide every route behind
429/423/503.

Afterwards the executor's own log must hold no unhandled error and no ``UndeclaredRefusal``
(a refusal its row does not declare, ``routes/contract.py``). ``API_TEST_EXAMPLES`` (default 25)
sets schemathesis's ``--max-examples``, ``API_TEST_SCENARIOS`` (default 100) the stateful
phase's in each round, ``API_TEST_ROUNDS`` (default 16) the most rounds it may take (a round
runs only while a link is still unfollowed; runs of unchanged code have needed 4 and 9).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agentsafe.executor.clock import format_ms
from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port
from tests.integration.bearer_principals import (
    APPROVERS_OPERATOR_ID,
    OPERATOR_ID,
    BearerPrincipals,
    principals_env,
)
from tests.plans import support as plans

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy.yaml"
ST = Path(sys.executable).parent / "st"
SEEDED = 20  # escalations waiting for a decision when schemathesis starts
ROLES = {
    "PROPOSER": "treasury-workflow",
    "APPROVER": "treasury-lead",
    "OPERATOR": OPERATOR_ID,
    "OPERATOR approvers": APPROVERS_OPERATOR_ID,  # the scope the other OPERATOR does not hold
}
HOUR_MS = 3_600_000
ROUNDS = int(os.environ.get("API_TEST_ROUNDS", "16"))


@pytest.mark.timeout(900)
async def test_the_served_document_holds_against_the_server(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    provider = ProviderProcess(logs)
    await provider.start()
    document = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    # A run may take minutes on a loaded machine: the seeded plan's provenance and approval
    # stay valid for an hour.
    document["plans"] = plans.policy(maxApprovalLifetimeMs=HOUR_MS)
    document["plans"]["sources"]["incidents"]["maxProvenanceAgeMs"] = HOUR_MS
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(document), encoding="utf-8")
    principals = BearerPrincipals(approvers_operator=True)
    env = principals_env(
        Workspace(tmp_path / "ws").environment(
            provider_url=provider.url, port=free_port(), policy_file=policy_file
        ),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_ESCALATION="APPROVAL",
        EXECUTOR_RATE_LIMIT_UNAUTHENTICATED="1000000/1",
        EXECUTOR_AUTH_LOCKOUT="0/60/300",
        EXECUTOR_HALT_ON_AUTH_FAILURES="1000000/1",
        EXECUTOR_HANDLERS="st_plan_host:register",  # a plan step executor (tests/api only)
        PYTHONPATH=str(Path(__file__).parent),
    )
    executor = ExecutorProcess(env, logs)
    try:
        await executor.start()
        served = await _served_document(executor.url, principals.token(OPERATOR_ID))
        tokens = {role: principals.token(who) for role, who in ROLES.items()}
        held = await _escalate(executor.url, tokens["PROPOSER"], count=SEEDED)
        seeds = await _seeds(executor.url, tokens, held)
        _same_as_docs(served)
        spec = tmp_path / "openapi.json"
        spec.write_text(json.dumps(served), encoding="utf-8")
        (tmp_path / "tokens.json").write_text(json.dumps(tokens))
        (tmp_path / "seeds.json").write_text(json.dumps(seeds))
        result = _schemathesis(spec, executor.url, tmp_path, "examples,coverage,fuzzing", seed=23)
        # Those phases halt the executor on purpose (a valid POST /v1/control/halt) and decide or
        # cancel requests: the chains of calls start on a running executor, with pending ones,
        # round after round (each with its own seed) until every link was followed.
        declared = _declared_links(served)
        followed: set[str] = set()
        chains = []
        for round_ in range(ROUNDS):
            await _resume(executor.url, tokens["OPERATOR"])
            first = 100 * (round_ + 1)
            held = await _escalate(executor.url, tokens["PROPOSER"], count=SEEDED, first=first)
            seeds = await _seeds(executor.url, tokens, held)
            (tmp_path / "seeds.json").write_text(json.dumps(seeds))
            chains.append(_schemathesis(spec, executor.url, tmp_path, "stateful", seed=round_))
            followed |= _followed_links(tmp_path / f"stateful-{round_}" / "events.ndjson")
            if declared <= followed:
                break
        assert executor.running, f"the executor died; see {executor.stderr_path}"
    finally:
        executor.terminate()
        provider.terminate()
    log = executor.stderr_path.read_text(encoding="utf-8", errors="replace")
    for run in (result, *chains):
        assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
    scenarios = re.search(r"Scenarios:\s+(\d+)", chains[0].stdout)
    assert scenarios is not None, "the stateful phase did not run"
    assert int(scenarios.group(1)) > 0, "the stateful phase ran no scenario"
    assert declared - followed == set(), (
        f"links the stateful phase never followed in {ROUNDS} rounds: {sorted(declared - followed)}"
    )
    print(f"every one of the {len(declared)} links followed in {len(chains)} round(s)")
    assert "UndeclaredRefusal" not in log, _lines(log, "UndeclaredRefusal")
    assert "unhandled error" not in log, _lines(log, "unhandled error")


async def _served_document(url: str, token: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/v1/control/openapi.json") as response:
            assert response.status == 401  # through the door like every OPERATOR route
        async with session.get(url + "/v1/control/openapi.json", headers=headers) as response:
            assert response.status == 200
            served: dict[str, object] = await response.json()
    return served


async def _escalate(url: str, token: str, *, count: int, first: int = 0) -> list[Any]:
    """Pending approval requests for the stateful phase: it lists them as the APPROVER and
    follows the document's links to read and decide each one. Returns their escalations."""
    held = []
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        for n in range(first, first + count):
            body = _proposal(n)
            async with session.post(url + "/v1/actions", json=body, headers=headers) as response:
                answer = await response.json()
            assert (response.status, answer["outcome"]) == (200, "ESCALATE_PENDING"), answer
            assert answer["escalation"]["request_id"]
            held.append(answer["escalation"])
    return held


async def _resume(url: str, token: str) -> None:
    """Resume the executor (it may or may not be halted) and see that it runs."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        reason = {"reason": "the fuzzing phases are over"}
        async with session.post(url + "/v1/control/resume", json=reason, headers=headers) as r:
            assert r.status == 200, await r.text()
        async with session.get(url + "/v1/control/status", headers=headers) as response:
            status = await response.json()
    assert status["halt"]["halted"] is False, status["halt"]


def _proposal(n: int) -> dict[str, Any]:
    return {
        "proposal": {
            "action": "create_payout",
            "target": f"payout:beneficiary-{n}",
            "parameters": {"amountMinor": 20_000, "currency": "USD"},
        },
        "idempotency_key": f"seed-{n}",
    }


async def _seeds(url: str, tokens: dict[str, str], held: list[Any]) -> dict[str, list[Any]]:
    """Valid bodies ``tests/api/st_hooks.py`` mixes into the generated ones, so that a chain can
    start where random data never would: a proposal the example policy escalates, two of the
    ``held`` escalations presented back and one withdrawn, a plan whose actor is the proposer
    and whose digests hold, an approval request and a step of that plan (the links put the live
    escalation, dry run and approval into them)."""
    now = time.time()
    observed = format_ms(now - 5)
    plan = plans.plan(
        plans.step(source=plans.binding(observedAt=observed)), actor=ROLES["PROPOSER"]
    )
    request = plans.request(issuedAt=format_ms(now - 1), expiresAt=format_ms(now + 1800))
    del request["approver"]  # the approving principal fills it in
    async with aiohttp.ClientSession() as session:

        async def post(path: str, role: str, body: Any) -> Any:
            headers = {"Authorization": f"Bearer {tokens[role]}"}
            async with session.post(url + path, json=body, headers=headers) as response:
                answer = await response.json()
            assert response.status == 200, answer
            return answer

        dry = await post("/v1/plans/dry-run", "PROPOSER", {"plan": plan})
        approved = await post(
            "/v1/plans/approvals", "APPROVER", {"dryRun": dry["dryRun"], "request": request}
        )
    step = {
        "dryRun": dry["dryRun"],
        "approval": approved["approval"],
        "context": plans.context(observedAt=observed),
        "stepId": "query-incidents",
        "operation": plans.operation(),
        "executionId": "exec-seed",
    }
    return {
        "POST /v1/actions": [_proposal(n) for n in range(SEEDED, SEEDED + 5)],
        "POST /v1/escalations": [{"escalation": escalation} for escalation in held[:2]],
        "POST /v1/escalations/cancel": [{"escalation": held[2], "reason": "no longer needed"}],
        "POST /v1/plans/dry-run": [{"plan": plan}],
        "POST /v1/plans/approvals": [{"dryRun": dry["dryRun"], "request": request}],
        "POST /v1/plans/steps": [step],
    }


def _declared_links(document: dict[str, Any]) -> set[str]:
    """Every link of the document, as schemathesis names a transition."""
    out = set()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                for name in response.get("links", {}):
                    out.add(f"{method.upper()} {path} -> [{status}] {name}")
    return out


def _followed_links(events: Path) -> set[str]:
    """The transitions the stateful phase applied, from its NDJSON event stream."""
    followed: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            transition = value.get("transition")
            if isinstance(transition, dict) and value.get("is_transition_applied"):
                followed.add(transition["id"].rsplit(" -> ", 1)[0])  # less "-> TARGET"
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for line in events.read_text(encoding="utf-8").splitlines():
        walk(json.loads(line))
    return followed


def _same_as_docs(served: dict[str, object]) -> None:
    """The process serves the document docs/openapi.json holds (every route is on here)."""
    docs = json.loads((REPO / "docs" / "openapi.json").read_text(encoding="utf-8"))
    assert served == docs, "the served document differs from docs/openapi.json"


# positive_data_acceptance: a schema-valid request must not be refused. The document states every
# bound and shape the server checks on /v1/actions, /v1/reconciliations, /v1/escalations and
# /v1/escalations/cancel (routes/schemas.py: integers within +-(2**53-1), the intent's own
# schema; issue 31), so none of them may answer 400 to it; what they check beyond a schema is
# state (409), a ceiling (413: the count of entries), the intent's and the policy's own rules
# (422). Elsewhere the server checks a body beyond what JSON Schema can say, with a stable code:
# - the plan library's own shapes (400/422, a host's code): the plan routes' bodies name their
#   required members, and ``valid_is_read`` (st_hooks.py) fails any REQUEST_INVALID there;
# - a halt or resume reason that is blank once trimmed (422);
# - an enrolment token for a principal the principals file does not hold as an APPROVER (422), or
#   a TTL spelled with a fraction (``2.0`` is JSON Schema's integer, not the strict model's: 400).
#
# not_a_server_error: 500 (and any 5xx but two) fails. 503 is a documented, fail-closed answer
# (halted: schemathesis halts the executor itself; not ready; the store unreachable) and 502 a plan
# step executor's failure, each checked by the schema and by the refusal contract.
#
# negative_data_rejection: schemathesis's own list, and 413: a value the document refuses by a
# count (JsonValue's maxItems) is refused with REQUEST_TOO_LARGE.
STATED = "^/v1/(actions|reconciliations|escalations(/cancel)?)$"
CHECKED_BEYOND = (
    "^/v1/(plans/.*|control/(halt|resume)"
    "|approvals/[^/]+|approvers/enrolment|control/approvers/[^/]+/enrolment-tokens)$"
)
CONFIG = f"""
[phases.stateful]
max-steps = 8
link-calibration = false

[phases.stateful.inference]
algorithms = []

[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", 502, 503]

[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]

[[operations]]
include-path-regex = "{STATED}"
checks.positive_data_acceptance.expected-statuses = [
  "2xx", "3xx", 401, 403, 404, 409, 413, 422, 429, "5xx",
]

[[operations]]
include-path-regex = "{CHECKED_BEYOND}"
checks.positive_data_acceptance.expected-statuses = [
  "2xx", "3xx", 400, 401, 403, 404, 409, 413, 422, 429, "5xx",
]
"""


def _schemathesis(
    spec: Path, url: str, tmp_path: Path, phases: str, *, seed: int
) -> subprocess.CompletedProcess[str]:
    """One ``st run`` of ``phases``; its reports go to a directory named for the last phase (and
    the stateful round)."""
    reports = tmp_path / phases.rsplit(",", 1)[-1]
    if phases == "stateful":
        reports = reports.with_name(f"stateful-{seed}")
    reports.mkdir()
    examples = os.environ.get("API_TEST_EXAMPLES", "25")
    if phases == "stateful":
        examples = os.environ.get("API_TEST_SCENARIOS", "100")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),  # st_hooks only, never the repository root
        "SCHEMATHESIS_HOOKS": "st_hooks",
        "AGENTSAFE_API_TOKENS": str(tmp_path / "tokens.json"),
        "AGENTSAFE_API_SEEDS": str(tmp_path / "seeds.json"),
        "AGENTSAFE_API_SPEC": str(spec),
    }
    (tmp_path / "schemathesis.toml").write_text(CONFIG, encoding="utf-8")
    argv = [
        str(ST),
        "run",
        str(spec),
        "--url",
        url,
        "--checks",
        "all",
        "--phases",
        phases,
        "--max-examples",
        examples,
        "--workers",
        "1",
        "--seed",
        str(seed),
        "--continue-on-failure",
        "--no-color",
        "--report",
        "junit,ndjson",
        "--report-dir",
        str(reports),
        "--report-ndjson-path",
        str(reports / "events.ndjson"),
    ]
    result = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=420, check=False
    )
    (reports / "st.log").write_text(result.stdout + result.stderr, encoding="utf-8")
    print(f"schemathesis output: {reports / 'st.log'}")
    return result


def _lines(log: str, needle: str) -> str:
    return "\n".join(line for line in log.splitlines() if needle in line)[:4000]
