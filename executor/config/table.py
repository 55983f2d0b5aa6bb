"""The table of configuration variables: one declarative row per variable.

Role: every variable the executor reads is one annotated row of :class:`Variables`: its name
(the attribute, upper-cased), its type (the annotation), its :class:`~.parsing.Kind` (how the
value is read), its default and bounds, its group, whether it is a secret, and its meaning for
people. Everything else is generated from these rows: :data:`CONFIG_KEYS` (the key list),
:data:`SECRET_NAMES`, :data:`ROWS` (the rows as plain records), the parsing
(``config/model.py`` runs each row's kind) and the variables' tables of
``docs/configuration.md`` (``tools/config_docs.py``; ``tests/test_config_docs.py`` fails when
the committed page is stale).

A row: ``name: type = var(kind, group, default, ge=, le=, secret=, shape=, default_doc=,
file_doc=, doc=)``. No default means required. ``secret=N`` makes it a secret, given as
``<NAME>`` or ``<NAME>_FILE``, and ``N`` is its place in :data:`SECRET_NAMES` (the order
secrets are checked and read). ``shape`` and ``default_doc`` replace the documentation's
"Type / range" and "Default" only where the kind, bounds and default do not say it; ``file_doc``
replaces "The same, as a mounted file".

The rows are in the order of ``docs/configuration.md``, which is the order pydantic validates
them in, and so the order in which the first of several faults is named.

This module is a declarative table (exempt from the 800-line limit).

Callers: ``config/model.py`` (:class:`ExecutorConfig` is these rows plus their parsing and
rules), ``config/__init__.py``, ``config/loading.py``, ``config/rules.py``,
``tools/config_view.py``, ``tools/config_docs.py``, ``config/readers.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import annotated_types
from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from ..canonical import MAX_SAFE_INTEGER
from ..windows import LockoutRule, RateRule
from .parsing import Kind
from .values import (
    BODY_TIMEOUT_SECONDS_DEFAULT,
    DOWNSTREAM_TIMEOUT_MS_DEFAULT,
    DOWNSTREAM_TIMEOUT_MS_MAX,
    HARD_LIMIT_WINDOW_COUNT_MAX,
    HARD_LIMIT_WINDOW_SECONDS_MAX,
    HEADER_TIMEOUT_SECONDS_DEFAULT,
    INTENT_TTL_SECONDS_DEFAULT,
    INTENT_TTL_SECONDS_MAX,
    MAX_CONNECTIONS_DEFAULT,
    MAX_CONNECTIONS_PER_SOURCE_DEFAULT,
    SECRET_FILE_SUFFIX,
    WORKERS_DEFAULT,
    WORKERS_MAX,
    CredentialKind,
    EffectMismatchAction,
    EscalationMode,
    ExecutorMode,
    PostureMode,
    PrivateKeyAlgorithm,
    SecretSource,
    SigningAlgorithm,
    TlsMinVersion,
)

__all__ = [
    "CONFIG_KEYS",
    "FILE_KEYS",
    "GROUPS",
    "ROWS",
    "SECRET_NAMES",
    "Group",
    "Row",
    "Variables",
]


@dataclass(frozen=True)
class Group:
    """A section of ``docs/configuration.md``: its title and the prose around its table."""

    title: str
    intro: str = ""
    outro: str = ""


PROCESS: Final = Group("Process and listener")
CALLERS: Final = Group("Callers")
POSTURE: Final = Group("Host posture and secrets")
TLS: Final = Group("TLS listener")
EGRESS: Final = Group("Egress")
JOURNAL: Final = Group("Attempt journal")
STORE: Final = Group(
    "Shared store and replicas",
    intro=(
        "With `EXECUTOR_STORE_URL`, every replica keeps its shared state in one PostgreSQL"
        " database (see [high-availability.md](high-availability.md)): grant claims, idempotency"
        " records, plan-step consumptions, approvals, the host-ceiling window and the"
        " open-attempt state with its leases. `EXECUTOR_JOURNAL_DIR` still holds this replica's"
        " own journal and evidence chain heads."
    ),
)
HALT: Final = Group("Halt")
CEILINGS: Final = Group("Host ceilings")
CLOCKS: Final = Group("Clocks")
EVIDENCE: Final = Group("Evidence")
DOWNSTREAM: Final = Group(
    "Downstream",
    outro=(
        "All `DOWNSTREAM_*` URLs: absolute, no credentials (`user:pass@`), no fragment; `https`,"
        " or plain `http` only to a loopback address literal with"
        " `DOWNSTREAM_ALLOW_INSECURE_LOOPBACK=true`."
    ),
)
TRACING: Final = Group(
    "Tracing",
    intro=(
        "The standard OpenTelemetry variables, read as the OpenTelemetry specification names"
        " them (see [tracing.md](tracing.md)). Tracing is off unless `OTEL_TRACES_EXPORTER` is"
        " `otlp`. Their values are checked at start by `executor/telemetry.py`; an invalid one"
        " refuses the start with `CONFIG_INVALID`, naming the variable."
        " `OTEL_EXPORTER_OTLP_HEADERS` (`k=v,k2=v2`, headers for the collector) is read too"
        " but is no row here: it may hold the collector's credential, which `agentsafe config`"
        " never shows."
    ),
)
GROUPS: Final[tuple[Group, ...]] = (
    PROCESS,
    CALLERS,
    POSTURE,
    TLS,
    EGRESS,
    JOURNAL,
    STORE,
    HALT,
    CEILINGS,
    CLOCKS,
    EVIDENCE,
    DOWNSTREAM,
    TRACING,
)
_REQUIRED: Final = object()
_GROUP_BY_TITLE: Final = {group.title: group for group in GROUPS}


def var(
    kind: Kind,
    group: Group,
    default: Any = _REQUIRED,
    *,
    doc: str,
    ge: int | None = None,
    le: int | None = None,
    default_factory: Any = None,
    secret: int | None = None,
    shape: str | None = None,
    default_doc: str | None = None,
    file_doc: str | None = None,
) -> Any:
    """One row: a pydantic field carrying the row's kind, group, secret rank and words."""
    extra: dict[str, Any] = {"kind": kind.value, "group": group.title}
    for name, value in (
        ("secret", secret),
        ("shape", shape),
        ("default_doc", default_doc),
        ("file_doc", file_doc),
    ):
        if value is not None:
            extra[name] = value
    constraints: dict[str, Any] = {}
    if ge is not None:
        constraints["ge"] = ge
    if le is not None:
        constraints["le"] = le
    if default_factory is not None:
        constraints["default_factory"] = default_factory
    elif default is not _REQUIRED:
        constraints["default"] = default
    return Field(description=doc, json_schema_extra=extra, **constraints)


class Variables(BaseModel):
    """Every configuration variable of the executor, one row each; attribute = lower-cased
    variable. :class:`~.model.ExecutorConfig` adds the parsing, the rules and the readers."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    agentsafe_env: str | None = var(
        Kind.TEXT,
        PROCESS,
        None,
        doc="`production` turns on every production rule below",
    )
    executor_mode: ExecutorMode = var(
        Kind.ENUM,
        PROCESS,
        doc="Shadow records what the authority would decide and never executes",
    )
    executor_policy_file: Path = var(
        Kind.PATH,
        PROCESS,
        doc="The policy document (YAML or JSON), the `spec.policy` of an AgentPolicy",
    )
    executor_state_dir: Path | None = var(
        Kind.ABSOLUTE_PATH,
        PROCESS,
        None,
        default_doc="required without `EXECUTOR_STORE_URL`",
        doc=(
            "The embedded use store (SQLite: grant claims, idempotency, approvals), "
            "in both modes; optional when the shared store is set"
        ),
    )
    executor_bind_address: str = var(
        Kind.BIND_ADDRESS,
        PROCESS,
        "127.0.0.1",
        doc="Where the listener binds",
    )
    port: int = var(
        Kind.INT,
        PROCESS,
        8443,
        ge=0,
        le=65535,
        doc="The listener's port; 0 lets the system choose",
    )
    executor_workers: int = var(
        Kind.INT,
        PROCESS,
        WORKERS_DEFAULT,
        ge=1,
        le=WORKERS_MAX,
        doc=(
            "Worker processes behind the one listener. `1`: one process, exactly as "
            "without the variable. Above 1, `agentsafe serve` is a small supervisor "
            "that starts N workers, each binding the same address and port with "
            "`SO_REUSEPORT` (the TLS listener too) and sharing the use store "
            "(`EXECUTOR_STATE_DIR`'s SQLite in WAL mode across processes, or "
            "`EXECUTOR_STORE_URL`); needs `EXECUTOR_JOURNAL_DIR`. See [Worker "
            "processes](#worker-processes)"
        ),
    )
    executor_header_timeout_seconds: int = var(
        Kind.INT,
        PROCESS,
        HEADER_TIMEOUT_SECONDS_DEFAULT,
        ge=1,
        le=300,
        doc=(
            "A connection must deliver a complete request head (request line and "
            "headers) within this many seconds of being accepted (the TLS handshake "
            "included) or of its previous response; otherwise it is closed. It is "
            "also how long an idle kept-alive connection stays open. See "
            "[listener.md](listener.md)"
        ),
    )
    executor_body_timeout_seconds: int = var(
        Kind.INT,
        PROCESS,
        BODY_TIMEOUT_SECONDS_DEFAULT,
        ge=1,
        le=300,
        doc=(
            "The whole request body must arrive within this many seconds of the "
            "route starting to read it; otherwise 408 `REQUEST_TIMEOUT` and the "
            "connection is closed"
        ),
    )
    executor_max_connections: int = var(
        Kind.INT,
        PROCESS,
        MAX_CONNECTIONS_DEFAULT,
        ge=1,
        le=65_535,
        doc=(
            "Open connections the listener holds at once; one more is answered 503 "
            "`CONNECTION_LIMIT_REACHED` and closed"
        ),
    )
    executor_max_connections_per_source: int = var(
        Kind.INT,
        PROCESS,
        MAX_CONNECTIONS_PER_SOURCE_DEFAULT,
        ge=1,
        le=65_535,
        shape="1..65535, at most `EXECUTOR_MAX_CONNECTIONS`",
        doc=("Open connections from one source address; so one peer cannot take every connection"),
    )
    executor_intent_ttl_seconds: int = var(
        Kind.INT,
        PROCESS,
        INTENT_TTL_SECONDS_DEFAULT,
        ge=1,
        le=INTENT_TTL_SECONDS_MAX,
        doc="How long a captured intent stays valid (`expires_at`)",
    )
    executor_handlers: tuple[str, ...] | None = var(
        Kind.HANDLERS,
        PROCESS,
        None,
        shape="comma-separated `module:function` or entry-point names",
        default_doc="every entry point of `agentsafe.handlers`",
        doc=(
            "The registration functions that add handlers, plan step executors and "
            "read-only MCP tools (docs/handlers.md); one that cannot be loaded "
            "refuses the start"
        ),
    )
    executor_authority_signing_key: SecretSource = var(
        Kind.SECRET,
        PROCESS,
        SecretSource("EXECUTOR_AUTHORITY_SIGNING_KEY"),
        secret=3,
        doc=("The built-in authority's Ed25519 PKCS#8 grant signing key; required in production"),
    )

    executor_principals_file: Path | None = var(
        Kind.PATH,
        CALLERS,
        None,
        doc=("The `agent-safe.principals/1` file; without it the executor runs in legacy mode"),
    )
    executor_allow_legacy_caller: bool = var(
        Kind.BOOL,
        CALLERS,
        False,
        doc="`true` lets production run in legacy mode, without a principals file",
    )
    executor_tenant_id: str | None = var(
        Kind.TENANT,
        CALLERS,
        None,
        doc="Legacy mode only (then required): the tenant the intents name",
    )
    executor_actor_id: str | None = var(
        Kind.TEXT,
        CALLERS,
        None,
        doc="Legacy mode only (then required): the actor the intents name",
    )
    executor_actor_type: str | None = var(
        Kind.TEXT,
        CALLERS,
        None,
        doc="Legacy mode only (then required): the actor's type, e.g. `AI_AGENT`",
    )
    executor_actor_runtime: str | None = var(
        Kind.TEXT,
        CALLERS,
        None,
        doc="Legacy mode only, optional: the actor's runtime",
    )
    executor_caller_token: SecretSource = var(
        Kind.SECRET,
        CALLERS,
        SecretSource("EXECUTOR_CALLER_TOKEN"),
        secret=1,
        doc="Legacy mode only (then required): the bearer token of the one caller",
    )
    executor_jwt_audience: str | None = var(
        Kind.TEXT,
        CALLERS,
        None,
        doc="With `EXECUTOR_JWKS_FILE`: the audience workload tokens must carry",
    )
    executor_jwks_file: Path | None = var(
        Kind.PATH,
        CALLERS,
        None,
        doc=(
            "With `EXECUTOR_JWT_AUDIENCE`: the JWKS workload tokens are verified "
            'against; each key set is bound to one issuer (an `"issuer"` member, the '
            '`{"issuers": [...]}` form, or the one workload issuer of the principals '
            "file; [door.md](door.md#workload-tokens))"
        ),
    )
    executor_jwks_url: str | None = var(
        Kind.HTTPS_URL,
        CALLERS,
        None,
        doc=("Optional: where the JWKS is refreshed from (last good set kept); needs the file"),
    )
    executor_jwks_ca_file: Path | None = var(
        Kind.PATH,
        CALLERS,
        None,
        doc="Optional: the CA bundle `EXECUTOR_JWKS_URL` is verified against",
    )
    executor_jwks_refresh_seconds: int = var(
        Kind.INT,
        CALLERS,
        300,
        ge=60,
        le=86_400,
        doc="How often the JWKS is refreshed",
    )
    executor_jwt_clock_tolerance_seconds: int = var(
        Kind.INT,
        CALLERS,
        30,
        ge=0,
        le=300,
        doc="Leeway on a workload token's times",
    )
    executor_rate_limit_unauthenticated: RateRule = var(
        Kind.RATE_RULE,
        CALLERS,
        RateRule(20, 60),
        doc=(
            "The window for attempts that never became a principal, one per source "
            "address (an IPv6 /64); once full the source's failures are 429, and a "
            "request that proves a principal is never refused by it "
            "([door.md](door.md))"
        ),
    )
    executor_auth_lockout: LockoutRule = var(
        Kind.LOCKOUT_RULE,
        CALLERS,
        LockoutRule(10, 60, 300),
        doc=(
            "Locks a principal (423) after failures an outsider cannot produce at "
            "will: a certificate our client CA issued that does not match its pin, "
            "the principal's own authorization refusals (never a workload token's "
            "failure, not even a bad signature under a known key: a `kid` is "
            "public); `0/…` disables ([door.md](door.md))"
        ),
    )
    executor_escalation: EscalationMode = var(
        Kind.ENUM,
        CALLERS,
        EscalationMode.NONE,
        doc=(
            "`NONE`: an ESCALATE hold is the answer. `APPROVAL`: durable approvals "
            "by APPROVER principals (replaces the specification's DIRECT/MANAGED); "
            "refused in shadow and in legacy mode"
        ),
    )
    executor_approval_origin: str | None = var(
        Kind.HTTPS_ORIGIN,
        CALLERS,
        None,
        doc=(
            "With `APPROVAL`: the approval page's origin as people reach it "
            "(`https://approvals.bank.example`); makes `approval_url` absolute and "
            "is the passkeys' relying party (its host is the RP id). Without it "
            "`approval_url` is the path on this listener and passkeys are off "
            "(`WEBAUTHN_NOT_CONFIGURED`)"
        ),
    )
    executor_approval_webhook_url: str | None = var(
        Kind.HTTPS_URL,
        CALLERS,
        None,
        doc=(
            "With `APPROVAL`, optional: every new approval request is POSTed here "
            "(Slack-compatible JSON: `text`, `blocks`) through the egress guard; "
            "failures are `APPROVAL_NOTIFY_FAILED` on the security stream"
        ),
    )
    executor_approval_webhook_ca_file: Path | None = var(
        Kind.PATH,
        CALLERS,
        None,
        doc=("Optional: the CA bundle the webhook is verified against (else the platform store)"),
    )
    executor_approval_webhook_allow_insecure_loopback: bool = var(
        Kind.BOOL,
        CALLERS,
        False,
        doc=(
            "Development and tests only: the webhook may answer from a loopback "
            "address; refused in production"
        ),
    )

    executor_posture: PostureMode = var(
        Kind.ENUM,
        POSTURE,
        PostureMode.ENFORCED,
        doc=("`DEVELOPMENT` waives the host-specific checks and says so; refused in production"),
    )
    executor_posture_interval_seconds: int = var(
        Kind.INT,
        POSTURE,
        60,
        ge=10,
        le=600,
        doc="How often the drift checks repeat",
    )
    executor_secrets_dir: Path | None = var(
        Kind.ABSOLUTE_PATH,
        POSTURE,
        None,
        doc=(
            "The directory every secret file must resolve inside; required in "
            "production when a secret file is given"
        ),
    )

    executor_tls_cert_file: Path | None = var(
        Kind.PATH,
        TLS,
        None,
        doc=("The listener's certificate chain; required unless the plaintext listener is allowed"),
    )
    executor_tls_key: SecretSource = var(
        Kind.SECRET,
        TLS,
        SecretSource("EXECUTOR_TLS_KEY"),
        secret=2,
        file_doc="The same, as a mounted file (the only form in production)",
        doc=("The listener's private key; required unless the plaintext listener is allowed"),
    )
    executor_tls_client_ca_file: Path | None = var(
        Kind.PATH,
        TLS,
        None,
        doc="Optional: the CA callers' client certificates chain to",
    )
    executor_tls_min_version: TlsMinVersion = var(
        Kind.ENUM,
        TLS,
        TlsMinVersion.TLS_1_3,
        doc="`1.2` admits TLS 1.2 with ECDHE and AEAD suites only",
    )
    executor_allow_plaintext_listener: bool = var(
        Kind.BOOL,
        TLS,
        False,
        doc=(
            "`true` runs the listener without TLS (a developer's machine); then no "
            "TLS variable may be set; refused in production"
        ),
    )

    executor_egress_max_response_bytes: int = var(
        Kind.INT,
        EGRESS,
        1024 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        doc="The most any outbound response may carry",
    )
    executor_egress_allow_cidrs: tuple[str, ...] = var(
        Kind.CIDRS,
        EGRESS,
        (),
        shape="comma-separated CIDRs, host bits clear, no `/0`",
        doc=(
            "The explicit override for a deliberate private destination: an answer "
            "inside one of these networks *and* inside a private-use block "
            "(`10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`, `100.64.0.0/10`, "
            "`fc00::/7`) is allowed. Nothing else is opened: loopback, link-local, "
            "6to4/Teredo/NAT64, every other special-purpose block and the cloud "
            "metadata addresses stay refused. The operator renders it from "
            "`spec.downstream.cidrs`. See [egress.md](egress.md)"
        ),
    )

    executor_journal_dir: Path | None = var(
        Kind.ABSOLUTE_PATH,
        JOURNAL,
        None,
        doc=("The attempt journal and the evidence chains' heads; required in enforcement"),
    )
    executor_journal_required: bool = var(
        Kind.BOOL,
        JOURNAL,
        True,
        doc="`false` lets enforcement run without a journal; refused in production",
    )
    executor_journal_retain_days: int = var(
        Kind.INT,
        JOURNAL,
        7,
        ge=1,
        le=366,
        doc=(
            "How many days of attempt files are kept; older day files are deleted by "
            "housekeeping once they hold no open attempt (a restart reads every file "
            "present)"
        ),
    )
    executor_housekeeping_interval_seconds: int = var(
        Kind.INT,
        JOURNAL,
        600,
        ge=1,
        le=86_400,
        doc=(
            "How often housekeeping runs (first at start): the use store is purged "
            "past its retention and journal day files past "
            "`EXECUTOR_JOURNAL_RETAIN_DAYS` are pruned"
        ),
    )
    executor_ready_requires_no_unknown_attempts: bool = var(
        Kind.BOOL,
        JOURNAL,
        False,
        doc="`true` keeps `/ready` at 503 while any attempt's outcome is unknown",
    )

    executor_store_url: SecretSource = var(
        Kind.SECRET,
        STORE,
        SecretSource("EXECUTOR_STORE_URL"),
        secret=8,
        file_doc=(
            "The same, as a mounted file: the only form accepted under `AGENTSAFE_ENV=production`"
        ),
        shape="secret (a libpq connection string: `postgresql://…` or `key=value`)",
        doc=(
            "The shared store's connection string; outside production only. Several "
            "hosts (`host=a,b`, `postgresql://a,b/db`) need "
            "`target_session_attrs=read-write` (or `primary`), else start refuses "
            "it: the pool then reconnects to whichever host is the primary after a "
            'failover (docs/high-availability.md, "Failover")'
        ),
    )
    executor_replica_id: str | None = var(
        Kind.REPLICA_ID,
        STORE,
        None,
        shape="1-253 of `A-Za-z0-9._-`",
        default_doc="the host name",
        doc=(
            "Names this replica as the owner of the attempts it opens (the operator "
            "sets the pod name)"
        ),
    )
    executor_attempt_lease_seconds: int = var(
        Kind.INT,
        STORE,
        30,
        ge=5,
        le=3600,
        doc=(
            "How long an open attempt stays this replica's without renewal; renewed "
            "every third of it while the replica lives, then another replica may "
            "take and reconcile it. An attempt still unknown is asked about again at "
            "most once per lease by its owner. It is also how long a request's "
            "idempotency key stays held before its attempt opens: a key left "
            "IN_PROGRESS by a request that lost the database (or died) before that "
            "is taken over by a retry after it. With `EXECUTOR_STORE_URL` it must be "
            "at least 1.5 × (`DOWNSTREAM_TIMEOUT_MS` in seconds + 1), so a send "
            "always ends under a live lease (`ATTEMPT_LEASE_TOO_SHORT`, exit 78; "
            'docs/high-availability.md, "Fencing")'
        ),
    )

    executor_halt_file: Path | None = var(
        Kind.ABSOLUTE_PATH,
        HALT,
        None,
        doc="Optional: a file whose presence halts the executor",
    )
    executor_halt_on_auth_failures: RateRule = var(
        Kind.RATE_RULE,
        HALT,
        RateRule(50, 60),
        doc=(
            "A spike of authentication failures at the door that halts the executor; "
            "each source adds at most its unauthenticated window, and a proven "
            "principal's refusals never count ([door.md](door.md))"
        ),
    )
    executor_halt_on_egress_refusals: RateRule = var(
        Kind.RATE_RULE,
        HALT,
        RateRule(5, 60),
        doc="A spike of refused outbound requests that halts it",
    )

    executor_hard_limit_single_minor: dict[str, int] = var(
        Kind.CEILINGS,
        CEILINGS,
        default_factory=dict,
        shape="`CUR:minor[,CUR:minor...]`, e.g. `CHF:2500000000,EUR:1000000`",
        doc=(
            "The most one action may move per ISO 4217 code (a code the `iso4217` "
            "package lists), in minor units (each 1..2^53−1); every ceiling refusal "
            "is a CEILING_REFUSED evidence line and a count "
            "(`agentsafe_ceiling_refusals_total{code}`)"
        ),
    )
    executor_hard_limit_window_seconds: int | None = var(
        Kind.INT,
        CEILINGS,
        None,
        ge=1,
        le=HARD_LIMIT_WINDOW_SECONDS_MAX,
        doc=(
            "The window the count and sum are measured over; required with either, "
            "refused without both"
        ),
    )
    executor_hard_limit_window_count: int | None = var(
        Kind.INT,
        CEILINGS,
        None,
        ge=1,
        le=HARD_LIMIT_WINDOW_COUNT_MAX,
        doc="Optional: the most actions that may execute inside the window",
    )
    executor_hard_limit_window_sum_minor: int | None = var(
        Kind.INT,
        CEILINGS,
        None,
        ge=1,
        le=MAX_SAFE_INTEGER,
        shape="1..2^53−1",
        doc="Optional: the most value that may move inside the window, in minor units",
    )

    executor_max_clock_skew_ms: int = var(
        Kind.INT,
        CLOCKS,
        2000,
        ge=100,
        le=60_000,
        doc="How far the authority's clock may differ before the executor halts",
    )

    executor_audit_checkpoint_lines: int = var(
        Kind.INT,
        EVIDENCE,
        100,
        ge=1,
        le=100_000,
        doc="Chained lines between persisted chain heads",
    )
    executor_evidence_dir: Path | None = var(
        Kind.ABSOLUTE_PATH,
        EVIDENCE,
        None,
        doc=("Where evidence bundles are written; exporting is refused (409) without it"),
    )
    executor_evidence_window_lines: int = var(
        Kind.INT,
        EVIDENCE,
        5000,
        ge=100,
        le=200_000,
        doc="Lines of each stream kept for a bundle",
    )
    executor_evidence_signing_key: SecretSource = var(
        Kind.SECRET,
        EVIDENCE,
        SecretSource("EXECUTOR_EVIDENCE_SIGNING_KEY"),
        secret=4,
        doc=(
            "Optional Ed25519 PKCS#8 key that signs a bundle's manifest; needs "
            "`EXECUTOR_EVIDENCE_DIR`"
        ),
    )
    executor_image_digest: str | None = var(
        Kind.IMAGE_DIGEST,
        EVIDENCE,
        None,
        shape="`[name@]algorithm:hex`",
        doc=(
            "What the platform says this deployment runs; carried into a bundle, "
            "marked not self-verified"
        ),
    )
    executor_on_effect_mismatch: EffectMismatchAction = var(
        Kind.ENUM,
        EVIDENCE,
        EffectMismatchAction.HALT,
        doc=(
            "What an observed effect (or a provider receipt) that is not the "
            "authorised one does: `HALT` halts with cause `EFFECT_MISMATCH`; `ALERT` "
            "records (security event) and counts "
            "(`agentsafe_effect_mismatches_total`) only "
            "(`docs/execution-outcomes.md`)"
        ),
    )
    banking_adapter_id: str = var(
        Kind.TEXT,
        EVIDENCE,
        "AGENTSAFE_CORE_BANKING",
        doc=(
            "The observer identity the effect evidence names (`observer.id` in every "
            "effect block and EFFECT_OBSERVED line, and so in the record the "
            "authority's finalization receives); read when the policy names a "
            "`banking.` handler (`docs/banking.md`)"
        ),
    )
    banking_adapter_version: str = var(
        Kind.TEXT,
        EVIDENCE,
        "0.1.0",
        doc="Its version",
    )

    downstream_url: str = var(
        Kind.DOWNSTREAM_URL,
        DOWNSTREAM,
        doc=(
            "Where the reference handler forwards the verified parameters; its path "
            "is the target's endpoint (`POST <path>`)"
        ),
    )
    downstream_allow_insecure_loopback: bool = var(
        Kind.BOOL,
        DOWNSTREAM,
        False,
        doc=(
            "`true` allows plain `http://` to a loopback address literal "
            "(`127.0.0.0/8`, `::1`) for every `DOWNSTREAM_*` URL; refused in "
            "production"
        ),
    )
    downstream_lookup_url: str | None = var(
        Kind.LOOKUP_URL,
        DOWNSTREAM,
        None,
        doc="Optional read-only lookup for reconciliation",
    )
    downstream_lookup_by_reference_url: str | None = var(
        Kind.REFERENCE_URL,
        DOWNSTREAM,
        None,
        doc=(
            "Optional: the banking family reads a posted effect back by the "
            "provider's own reference before it confirms it "
            "(`docs/execution-outcomes.md`); also handed to registered handlers "
            "(`seam.downstream`)"
        ),
    )
    downstream_system: str = var(
        Kind.TEXT,
        DOWNSTREAM,
        doc="The downstream target's system, as the intent names it",
    )
    downstream_operation: str = var(
        Kind.TEXT,
        DOWNSTREAM,
        doc="The downstream target's operation",
    )
    downstream_environment: str | None = var(
        Kind.TEXT,
        DOWNSTREAM,
        None,
        doc=(
            "Optional: the downstream target's environment (`sandbox`, `production`, "
            "...); when set, every intent's `downstream_target` carries it as "
            "`environment` (so its hash covers it, and a policy reads it as "
            "`target.environment`); unset, the intent keeps the three members and "
            "bytes the peer vectors hash"
        ),
    )
    downstream_timeout_ms: int = var(
        Kind.INT,
        DOWNSTREAM,
        DOWNSTREAM_TIMEOUT_MS_DEFAULT,
        ge=1,
        le=DOWNSTREAM_TIMEOUT_MS_MAX,
        doc="The dispatch timeout, never more than the grant has left",
    )
    downstream_ca_file: Path | None = var(
        Kind.PATH,
        DOWNSTREAM,
        None,
        doc="Optional: the PEM bundle the downstream is verified against",
    )
    downstream_spki_pins: tuple[str, ...] | None = var(
        Kind.PINS,
        DOWNSTREAM,
        None,
        shape="two or more `sha256/<base64>`, comma-separated",
        doc="Optional SPKI pins (each the base64 of a 32-byte digest, all distinct)",
    )
    downstream_credential_kind: CredentialKind = var(
        Kind.ENUM,
        DOWNSTREAM,
        CredentialKind.STATIC_HEADER,
        doc=(
            "How the executor proves itself to the downstream; the other kinds' "
            "variables must be absent"
        ),
    )
    downstream_credential: SecretSource = var(
        Kind.SECRET,
        DOWNSTREAM,
        SecretSource("DOWNSTREAM_CREDENTIAL"),
        secret=5,
        doc="STATIC_HEADER (required): the header value, prefix included",
    )
    downstream_credential_header: str | None = var(
        Kind.HEADER_NAME,
        DOWNSTREAM,
        None,
        doc=(
            "STATIC_HEADER (required): the header it goes in; not one the executor "
            "sets itself (`executor/headers.py`: framing and hop-by-hop headers, "
            "`content-type`, `idempotency-key`, the signature headers, any "
            "`x-agent-safe-*`)"
        ),
    )
    downstream_token_url: str | None = var(
        Kind.DOWNSTREAM_URL,
        DOWNSTREAM,
        None,
        doc="PRIVATE_KEY_JWT (required): the token endpoint",
    )
    downstream_client_id: str | None = var(
        Kind.TEXT,
        DOWNSTREAM,
        None,
        doc="PRIVATE_KEY_JWT (required): the client id",
    )
    downstream_private_key: SecretSource = var(
        Kind.SECRET,
        DOWNSTREAM,
        SecretSource("DOWNSTREAM_PRIVATE_KEY"),
        secret=6,
        doc="PRIVATE_KEY_JWT (required): the PKCS#8 key the assertion is signed with",
    )
    downstream_private_key_id: str | None = var(
        Kind.TEXT,
        DOWNSTREAM,
        None,
        doc="PRIVATE_KEY_JWT, optional: the assertion's `kid`",
    )
    downstream_private_key_algorithm: PrivateKeyAlgorithm | None = var(
        Kind.ENUM,
        DOWNSTREAM,
        None,
        default_doc="`ES256` (PRIVATE_KEY_JWT only)",
        doc="PRIVATE_KEY_JWT: the assertion's algorithm",
    )
    downstream_token_audience: str | None = var(
        Kind.TEXT,
        DOWNSTREAM,
        None,
        default_doc="the token endpoint",
        doc="PRIVATE_KEY_JWT, optional: the assertion's audience",
    )
    downstream_token_scope: str | None = var(
        Kind.TEXT,
        DOWNSTREAM,
        None,
        doc="PRIVATE_KEY_JWT, optional: the scope requested",
    )
    downstream_signing_key: SecretSource = var(
        Kind.SECRET,
        DOWNSTREAM,
        SecretSource("DOWNSTREAM_SIGNING_KEY"),
        secret=7,
        doc="SIGNED_REQUEST (required): the Ed25519 PKCS#8 key or the HMAC secret",
    )
    downstream_signing_key_id: str | None = var(
        Kind.TEXT,
        DOWNSTREAM,
        None,
        doc="SIGNED_REQUEST (required): the `keyid` the downstream knows the key by",
    )
    downstream_signing_algorithm: SigningAlgorithm | None = var(
        Kind.ENUM,
        DOWNSTREAM,
        None,
        default_doc="`ed25519` (SIGNED_REQUEST only)",
        doc="SIGNED_REQUEST: the signature algorithm",
    )
    otel_sdk_disabled: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        doc="`true`: tracing off, whatever else is set",
    )
    otel_traces_exporter: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`none`",
        doc=(
            "`none` (off) or `otlp` (OTLP/HTTP to the collector); the SDK's own default is"
            " `otlp`, agentsafe's `none`"
        ),
    )
    otel_exporter_otlp_endpoint: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`http://localhost:4318`",
        doc="The collector's base URL (http or https); `/v1/traces` is appended",
    )
    otel_exporter_otlp_traces_endpoint: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        doc="The full traces URL, used as given (wins over `OTEL_EXPORTER_OTLP_ENDPOINT`)",
    )
    otel_exporter_otlp_protocol: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`http/protobuf`",
        doc="`http/protobuf` only",
    )
    otel_exporter_otlp_traces_protocol: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        doc="The same, for traces only (wins over `OTEL_EXPORTER_OTLP_PROTOCOL`)",
    )
    otel_exporter_otlp_timeout: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`10000`",
        doc="One export's bound, in milliseconds",
    )
    otel_traces_sampler: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`parentbased_always_on`",
        doc=(
            "`always_on`, `always_off`, `traceidratio`, `parentbased_always_on`,"
            " `parentbased_always_off` or `parentbased_traceidratio`"
        ),
    )
    otel_traces_sampler_arg: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`1.0`",
        doc="The ratio of the `traceidratio` samplers, 0 to 1 (`0.01`: 1%)",
    )
    otel_service_name: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`agentsafe-executor`",
        doc="The traces' `service.name`",
    )
    otel_resource_attributes: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        doc="More resource attributes, `k=v,k2=v2` (percent-decoded)",
    )
    otel_bsp_max_queue_size: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`2048`",
        doc="Spans queued for export at most; one more is dropped and counted",
    )
    otel_bsp_schedule_delay: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`5000`",
        doc="Milliseconds between two exports",
    )
    otel_bsp_max_export_batch_size: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`512`",
        doc="Spans per export at most",
    )
    otel_bsp_export_timeout: str | None = var(
        Kind.TEXT,
        TRACING,
        None,
        default_doc="`30000`",
        doc="Milliseconds one batch export may take",
    )


@dataclass(frozen=True)
class Row:
    """One row of the table as a plain record (for the key list, the docs and the view)."""

    name: str
    attribute: str
    kind: Kind
    group: Group
    doc: str
    required: bool
    default: Any
    ge: int | None
    le: int | None
    secret: int | None
    shape: str | None
    default_doc: str | None
    file_doc: str | None

    @property
    def file_key(self) -> str | None:
        """``<NAME>_FILE`` for a secret, else ``None``."""
        return self.name + SECRET_FILE_SUFFIX if self.secret is not None else None


def _row(attribute: str, field: FieldInfo) -> Row:
    extra = field.json_schema_extra
    assert isinstance(extra, dict)
    low: int | None = None
    high: int | None = None
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            low = int(item.ge)  # type: ignore[call-overload]
        elif isinstance(item, annotated_types.Le):
            high = int(item.le)  # type: ignore[call-overload]
    secret = extra.get("secret")
    required = field.is_required()
    return Row(
        name=attribute.upper(),
        attribute=attribute,
        kind=Kind(str(extra["kind"])),
        group=_GROUP_BY_TITLE[str(extra["group"])],
        doc=field.description or "",
        required=required,
        default=None if required else field.get_default(call_default_factory=True),
        ge=low,
        le=high,
        secret=secret if isinstance(secret, int) else None,
        shape=_text(extra.get("shape")),
        default_doc=_text(extra.get("default_doc")),
        file_doc=_text(extra.get("file_doc")),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


ROWS: Final[tuple[Row, ...]] = tuple(
    _row(attribute, field) for attribute, field in Variables.model_fields.items()
)
"""Every row, in the table's order."""

SECRET_NAMES: Final[tuple[str, ...]] = tuple(
    row.name
    for row in sorted((r for r in ROWS if r.secret is not None), key=lambda r: r.secret or 0)
)
"""The secrets, in their rank's order: each given as ``<NAME>`` or ``<NAME>_FILE``."""

FILE_KEYS: Final[frozenset[str]] = frozenset(name + SECRET_FILE_SUFFIX for name in SECRET_NAMES)

# Every variable, in the order of docs/configuration.md. A secret appears twice: as ``<NAME>``
# (the value, outside production only) and as ``<NAME>_FILE`` (the path of a mounted file).
CONFIG_KEYS: Final[tuple[str, ...]] = tuple(
    key for row in ROWS for key in (row.name, row.file_key) if key is not None
)
