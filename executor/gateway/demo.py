"""The gateway's demo authority: what ``agentsafe proxy`` runs with no configuration at all.

A synthetic policy and a throwaway configuration on loopback: the built-in authority in the same
process, a temporary state and journal directory, an ephemeral grant key, the development posture
(a laptop), shadow unless ``--enforce``; only the listener's deadlines and caps
(:data:`LISTENER_SETTINGS`) are taken from the environment. Everything the gateway prints in
this mode says so (:data:`BANNER`), and every answer carries ``x-agentsafe-authority: demo``.
Nothing here is for a deployment: configure ``EXECUTOR_*`` for that.

The synthetic policy (``http_request``, handler ``gateway_forward``): a path under ``/admin`` is
BLOCK (``DEMO_ADMIN_PATH``); a JSON body with an ``amountMinor`` over 5000 is BLOCK
(``DEMO_AMOUNT_ABOVE_LIMIT``); a DELETE is ESCALATE; everything else is ALLOW.

Callers: ``proxy.py``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

__all__ = ["BANNER", "DEMO_POLICY", "LISTENER_SETTINGS", "demo_environment"]

LISTENER_SETTINGS: Final = frozenset(
    {
        "EXECUTOR_HEADER_TIMEOUT_SECONDS",
        "EXECUTOR_BODY_TIMEOUT_SECONDS",
        "EXECUTOR_MAX_CONNECTIONS",
        "EXECUTOR_MAX_CONNECTIONS_PER_SOURCE",
    }
)
"""The listener's deadlines and caps: the demo keeps them from the environment (they say how
the gateway listens, not what it decides)."""

BANNER: Final = "DEMO AUTHORITY (local, loopback, synthetic policy; not for production) | "

DEMO_POLICY: Final = """\
# agentsafe proxy's DEMO policy: synthetic, for a first look only.
actions:
  - name: http_request
    handler: gateway_forward
    parameters:
      type: object
      required: [method, path, query, body_digest, body]
      additionalProperties: false
      properties:
        method: {enum: [POST, PUT, PATCH, DELETE]}
        path: {type: string}
        query: {type: string}
        body_digest: {type: string}
        body: {}
    rules:
      - name: no-admin
        when: "params.path.startsWith('/admin')"
        verdict: BLOCK
        reasonCode: DEMO_ADMIN_PATH
      - name: amount-limit
        when: >-
          params.body != null && has(params.body.amountMinor)
          && params.body.amountMinor > 5000
        verdict: BLOCK
        reasonCode: DEMO_AMOUNT_ABOVE_LIMIT
      - name: deletes-need-a-person
        when: "params.method == 'DELETE'"
        verdict: ESCALATE
        approvers: [demo-approver]
      - name: everything-else
        when: "true"
        verdict: ALLOW
"""


def demo_environment(
    upstream: str, root: Path, *, enforce: bool, base: dict[str, str]
) -> dict[str, str]:
    """A complete executor configuration under ``root`` for the demo authority."""
    for name in ("state", "journal", "secrets"):
        (root / name).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root / name, 0o700)
    policy = root / "demo-policy.yaml"
    policy.write_text(DEMO_POLICY, encoding="utf-8")
    host = urlsplit(upstream).hostname or "upstream"
    env = {
        k: v
        for k, v in base.items()
        if k in LISTENER_SETTINGS or not k.startswith(("EXECUTOR_", "DOWNSTREAM_"))
    }
    env.update(
        {
            "EXECUTOR_MODE": "ENFORCEMENT" if enforce else "SHADOW",
            "EXECUTOR_POSTURE": "DEVELOPMENT",
            "EXECUTOR_POLICY_FILE": str(policy),
            "EXECUTOR_STATE_DIR": str(root / "state"),
            "EXECUTOR_JOURNAL_DIR": str(root / "journal"),
            "EXECUTOR_BIND_ADDRESS": "127.0.0.1",
            "EXECUTOR_ALLOW_PLAINTEXT_LISTENER": "true",
            "EXECUTOR_TENANT_ID": "00000000-0000-4000-8000-00000000d3e0",
            "EXECUTOR_ACTOR_ID": "gateway-demo-agent",
            "EXECUTOR_ACTOR_TYPE": "AI_AGENT",
            "EXECUTOR_CALLER_TOKEN": secrets.token_urlsafe(32),
            "DOWNSTREAM_URL": upstream,
            "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK": "true",
            "DOWNSTREAM_SYSTEM": host,
            "DOWNSTREAM_OPERATION": "http",
            "DOWNSTREAM_CREDENTIAL_KIND": "STATIC_HEADER",
            "DOWNSTREAM_CREDENTIAL_HEADER": "x-agentsafe-demo-credential",
            "DOWNSTREAM_CREDENTIAL": "demo-" + secrets.token_hex(8),
        }
    )
    return env
