"""schemathesis against a real ``agentsafe serve`` (issue 23): ``make api-test``.

One executor process with every optional section on (a ``plans`` section in its policy,
``EXECUTOR_ESCALATION=APPROVAL``), a principals file with a PROPOSER, two APPROVERs and an
OPERATOR holding every scope, and the synthetic provider behind it. The test reads the OpenAPI
document the executor serves to its OPERATOR (``GET /v1/control/openapi.json``), checks it is the
document ``docs/openapi.json`` holds for those routes, seeds pending approval requests (proposals
the example policy escalates), and runs ``st run`` on it with every
standard check (``--checks all``: no 500, status codes, content types, headers and bodies conform
to the document, negative data is refused, auth is not ignored, unsupported methods answer 405,
...), every phase (examples, coverage, fuzzing, and the stateful phase's chains of calls), and the
custom refusal contract (``tests/api/st_hooks.py``). Each operation is called as a principal of
the role it names. The stateful phase must run scenarios; the document's links let it list the
pending approvals, then read and decide them.

The door's shared window for unauthenticated attempts and its lockout are widened for the run
(``EXECUTOR_RATE_LIMIT_UNAUTHENTICATED``, ``EXECUTOR_AUTH_LOCKOUT``): schemathesis sends thousands
of credential-less requests on purpose, and a locked door would hide every route behind 429/423.

Afterwards the executor's own log must hold no unhandled error and no ``UndeclaredRefusal``
(a refusal its row does not declare, ``routes/contract.py``). ``API_TEST_EXAMPLES`` (default 25)
sets schemathesis's ``--max-examples``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port
from tests.integration.bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env
from tests.plans import support as plans

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy.yaml"
ST = Path(sys.executable).parent / "st"
SEEDED = 20  # escalations waiting for a decision when schemathesis starts
ROLES = {"PROPOSER": "treasury-workflow", "APPROVER": "treasury-lead", "OPERATOR": OPERATOR_ID}


@pytest.mark.timeout(600)
async def test_the_served_document_holds_against_the_server(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    provider = ProviderProcess(logs)
    await provider.start()
    document = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    document["plans"] = plans.policy()
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(document), encoding="utf-8")
    principals = BearerPrincipals()
    env = principals_env(
        Workspace(tmp_path / "ws").environment(
            provider_url=provider.url, port=free_port(), policy_file=policy_file
        ),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_ESCALATION="APPROVAL",
        EXECUTOR_RATE_LIMIT_UNAUTHENTICATED="1000000/1",
        EXECUTOR_AUTH_LOCKOUT="0/60/300",
    )
    executor = ExecutorProcess(env, logs)
    try:
        await executor.start()
        served = await _served_document(executor.url, principals.token(OPERATOR_ID))
        await _escalate(executor.url, principals.token(ROLES["PROPOSER"]), count=SEEDED)
        _same_as_docs(served)
        spec = tmp_path / "openapi.json"
        spec.write_text(json.dumps(served), encoding="utf-8")
        tokens = tmp_path / "tokens.json"
        tokens.write_text(json.dumps({r: principals.token(p) for r, p in ROLES.items()}))
        result = _schemathesis(spec, executor.url, tokens, tmp_path)
        assert executor.running, f"the executor died; see {executor.stderr_path}"
    finally:
        executor.terminate()
        provider.terminate()
    log = executor.stderr_path.read_text(encoding="utf-8", errors="replace")
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-4000:]
    scenarios = re.search(r"Scenarios:\s+(\d+)", result.stdout)
    assert scenarios is not None, "the stateful phase did not run"
    assert int(scenarios.group(1)) > 0, "the stateful phase ran no scenario"
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


async def _escalate(url: str, token: str, *, count: int) -> None:
    """Pending approval requests for the stateful phase: it lists them as the APPROVER and
    follows the document's links to read and decide each one."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        for n in range(count):
            body = {
                "proposal": {
                    "action": "create_payout",
                    "target": f"payout:beneficiary-{n}",
                    "parameters": {"amountMinor": 20_000, "currency": "USD"},
                },
                "idempotency_key": f"seed-{n}",
            }
            async with session.post(url + "/v1/actions", json=body, headers=headers) as response:
                answer = await response.json()
            assert (response.status, answer["outcome"]) == (200, "ESCALATE_PENDING"), answer
            assert answer["escalation"]["request_id"]


def _same_as_docs(served: dict[str, object]) -> None:
    """The process serves the document docs/openapi.json holds (every route is on here)."""
    docs = json.loads((REPO / "docs" / "openapi.json").read_text(encoding="utf-8"))
    assert served == docs, "the served document differs from docs/openapi.json"


# positive_data_acceptance: a schema-valid request must not be refused, except where the server
# checks a body beyond what JSON Schema can say, and says so with a stable code: the intent's
# RFC 8785 bounds (integers within +-(2**53-1), nesting, counts: 400/413), its ceilings (422), the
# intent binding inside a recovery or an escalation object (400/409), the plan library's own
# shapes (400/422, a host's code), a halt or resume reason that is blank once trimmed (422).
#
# not_a_server_error: 500 (and any 5xx but two) fails. 503 is a documented, fail-closed answer
# (halted: schemathesis halts the executor itself; not ready; the store unreachable) and 502 a plan
# step executor's failure, each checked by the schema and by the refusal contract.
CHECKED_BEYOND = (
    "^/v1/(actions|reconciliations|escalations(/cancel)?|plans/.*|control/(halt|resume))$"
)
CONFIG = f"""
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", 502, 503]

[[operations]]
include-path-regex = "{CHECKED_BEYOND}"
checks.positive_data_acceptance.expected-statuses = [
  "2xx", "3xx", 400, 401, 403, 404, 409, 413, 422, 429, "5xx",
]
"""


def _schemathesis(
    spec: Path, url: str, tokens: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    examples = os.environ.get("API_TEST_EXAMPLES", "25")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),  # st_hooks only, never the repository root
        "SCHEMATHESIS_HOOKS": "st_hooks",
        "AGENTSAFE_API_TOKENS": str(tokens),
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
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        examples,
        "--workers",
        "1",
        "--seed",
        "23",
        "--continue-on-failure",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path / "report"),
    ]
    result = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540, check=False
    )
    (tmp_path / "st.log").write_text(result.stdout + result.stderr, encoding="utf-8")
    print(f"schemathesis output: {tmp_path / 'st.log'}")
    return result


def _lines(log: str, needle: str) -> str:
    return "\n".join(line for line in log.splitlines() if needle in line)[:4000]
