"""The one registry of agentsafe's stable codes: code -> (HTTP status, one-line meaning).

Every error agentsafe raises on purpose carries one of these codes (``AgentSafeError.code``), and
every refusal on the wire is ``{"error": {"code", "message"}}`` with one of them. Domain code
raises by member (``RequestRejected(Code.INTENT_EXPIRED, "...")``, ``StoreError("...",
code=Code.STORE_CLOSED)``), never by a bare string and never with a status; the HTTP edge
(``routes/``) answers a refusal with ``code.status``. ``status`` is ``None`` for a code that is
never an HTTP answer of its own: a start-up refusal (exit status 78), an internal fault the edge
answers as 500 ``INTERNAL_ERROR``, an outbound failure reported among an answer's reason codes,
or a verdict of an offline verifier. ``docs/error-codes.md`` lists every code and
``tests/test_codes.py`` checks it against this table.

:class:`Code` is a :class:`~enum.StrEnum`: a member is its own name as a string, so it serializes
to JSON and compares with ``==`` as the plain code does. Every reason code the executor itself
puts in a verdict's ``reason_codes`` (``POLICY_NO_MATCH``, ``EXECUTOR_HALTED``,
``RECONCILED_COMPLETED``, a rule's default ``POLICY_BLOCKED``, ...) is a member too, and
:data:`REASON_CODES` names them; a policy author's own reason code (``AMOUNT_ABOVE_POLICY``) is
data from the policy file and is not listed. A plan step executor supplied by the host may
refuse with its own code; the plan routes answer such a code with :data:`HOST_CODE_STATUS`.

Ground floor: imports nothing of agentsafe. Callers: ``errors.py`` and every module that raises
or answers a code; ``routes/refusals.py`` maps a code to its HTTP status.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["HOST_CODE_STATUS", "REASON_CODES", "Code"]

HOST_CODE_STATUS: Final = 422
"""The status of a code not in the registry: only a host plan step executor's own refusal."""


class Code(StrEnum):
    """A stable code with its HTTP status (``None``: never an HTTP answer) and its meaning."""

    status: int | None
    meaning: str

    def __new__(cls, value: str, status: int | None, meaning: str) -> Code:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.meaning = meaning
        return member

    # -- the hierarchy's defaults ----------------------------------------------------------------
    AGENTSAFE_ERROR = "AGENTSAFE_ERROR", None, "an agentsafe error that names no more precise code"
    CANONICALIZATION_FAILED = "CANONICALIZATION_FAILED", None, "a value has no RFC 8785 form"
    CONFIG_INVALID = "CONFIG_INVALID", None, "a configuration variable is missing or invalid"
    HANDLER_CONTRACT_VIOLATED = "HANDLER_CONTRACT_VIOLATED", None, "a handler broke its contract"
    JOURNAL_UNAVAILABLE = "JOURNAL_UNAVAILABLE", None, "the attempt journal cannot take a record"
    POLICY_INVALID = "POLICY_INVALID", 400, "the policy document is not valid"
    STORE_UNAVAILABLE = (
        "STORE_UNAVAILABLE",
        503,
        "the use store cannot answer (the shared database is unreachable); nothing was executed",
    )

    # -- the HTTP edge ---------------------------------------------------------------------------
    REQUEST_INVALID = "REQUEST_INVALID", 400, "the request does not match the route's schema"
    REQUEST_MALFORMED = "REQUEST_MALFORMED", 400, "the body is not valid JSON, or its framing"
    REQUEST_TIMEOUT = (
        "REQUEST_TIMEOUT",
        408,
        "the body did not arrive within EXECUTOR_BODY_TIMEOUT_SECONDS; the connection is closed",
    )
    HTTP_MALFORMED = (
        "HTTP_MALFORMED",
        400,
        "the request line or a header is not HTTP/1.1; nothing of it is echoed",
    )
    CONNECTION_LIMIT_REACHED = (
        "CONNECTION_LIMIT_REACHED",
        503,
        "EXECUTOR_MAX_CONNECTIONS or _PER_SOURCE connections are open; retry",
    )
    REQUEST_TOO_DEEP = "REQUEST_TOO_DEEP", 400, "the JSON body nests too deeply"
    REQUEST_TOO_LARGE = (
        "REQUEST_TOO_LARGE",
        413,
        "the body, an array or the entry count is too large",
    )
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE", 415, "the body is not application/json"
    NOT_FOUND = "NOT_FOUND", 404, "no such route"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED", 405, "the route does not take this method"
    REQUEST_REFUSED = (
        "REQUEST_REFUSED",
        None,
        "the HTTP server refused the request itself; the answer keeps its status",
    )
    INTERNAL_ERROR = (
        "INTERNAL_ERROR",
        500,
        "the executor failed before it could answer; the outcome is not known from this answer",
    )
    ROUTE_CONTRACT_VIOLATED = (
        "ROUTE_CONTRACT_VIOLATED",
        None,
        "a route answered a code or status its row does not declare (a warning; docs/openapi.md)",
    )

    # -- the door: authentication and authorization ----------------------------------------------
    RATE_LIMITED = "RATE_LIMITED", 429, "too many attempts; retry after Retry-After seconds"
    AUTH_REQUIRED = "AUTH_REQUIRED", 401, "no credential was presented"
    AUTH_FAILED = "AUTH_FAILED", 401, "the credential is not accepted"
    AUTH_AMBIGUOUS = "AUTH_AMBIGUOUS", 401, "more than one credential or principal was presented"
    PRINCIPAL_LOCKED = "PRINCIPAL_LOCKED", 423, "the principal is locked after repeated failures"
    ROLE_FORBIDDEN = "ROLE_FORBIDDEN", 403, "the route is not for the caller's role"
    SCOPE_FORBIDDEN = "SCOPE_FORBIDDEN", 403, "the caller lacks the route's scope"
    ACTION_NOT_PERMITTED_FOR_PRINCIPAL = (
        "ACTION_NOT_PERMITTED_FOR_PRINCIPAL",
        403,
        "the caller may not propose this action",
    )
    JWT_ALGORITHM_REFUSED = "JWT_ALGORITHM_REFUSED", 401, "the workload token's alg is refused"
    JWT_AUDIENCE_MISMATCH = (
        "JWT_AUDIENCE_MISMATCH",
        401,
        "the workload token is for another audience",
    )
    JWT_CLAIM_MISMATCH = "JWT_CLAIM_MISMATCH", 401, "a required claim of the workload token differs"
    JWT_EXPIRED = "JWT_EXPIRED", 401, "the workload token is expired, not yet valid or too old"
    JWT_ISSUER_UNKNOWN = "JWT_ISSUER_UNKNOWN", 401, "no principal accepts the token's issuer"
    JWT_MALFORMED = (
        "JWT_MALFORMED",
        None,
        "the workload token is not a usable JWS (answered as AUTH_FAILED)",
    )
    JWT_SIGNATURE_INVALID = "JWT_SIGNATURE_INVALID", 401, "the workload token's signature fails"
    JWT_SUBJECT_UNKNOWN = "JWT_SUBJECT_UNKNOWN", 401, "no principal has the token's subject"
    JWKS_INVALID = "JWKS_INVALID", None, "a JWKS cannot be used"

    # -- the principals file (start-up and reload) -----------------------------------------------
    PRINCIPALS_ACTION_UNKNOWN = (
        "PRINCIPALS_ACTION_UNKNOWN",
        None,
        "an allowed action has no handler",
    )
    PRINCIPALS_ACTOR_COLLISION = (
        "PRINCIPALS_ACTOR_COLLISION",
        None,
        "two principals spell one actor differently (case or compatibility form)",
    )
    PRINCIPALS_CREDENTIAL_SHARED = (
        "PRINCIPALS_CREDENTIAL_SHARED",
        None,
        "two principals claim the same credential",
    )
    PRINCIPALS_DUPLICATE_ID = "PRINCIPALS_DUPLICATE_ID", None, "a principal id appears twice"
    PRINCIPALS_FILE_INVALID = (
        "PRINCIPALS_FILE_INVALID",
        None,
        "the file is not agent-safe.principals/1",
    )
    PRINCIPALS_FILE_MODE = "PRINCIPALS_FILE_MODE", None, "the file is writable by group or others"
    PRINCIPALS_FILE_OWNER = "PRINCIPALS_FILE_OWNER", None, "the file has an unexpected owner"
    PRINCIPALS_FILE_TOO_LARGE = "PRINCIPALS_FILE_TOO_LARGE", None, "the file is larger than 1 MiB"
    PRINCIPALS_FILE_UNREADABLE = "PRINCIPALS_FILE_UNREADABLE", None, "the file cannot be read"
    PRINCIPALS_JWT_UNCONFIGURED = (
        "PRINCIPALS_JWT_UNCONFIGURED",
        None,
        "a workload principal needs EXECUTOR_JWT_AUDIENCE and EXECUTOR_JWKS_FILE",
    )
    PRINCIPALS_MTLS_UNCONFIGURED = (
        "PRINCIPALS_MTLS_UNCONFIGURED",
        None,
        "an MTLS principal needs EXECUTOR_TLS_CLIENT_CA_FILE",
    )
    PRINCIPALS_RATE_LIMIT_INVALID = (
        "PRINCIPALS_RATE_LIMIT_INVALID",
        None,
        "a rate_limit is not <count>/<seconds>",
    )
    PRINCIPALS_ROLE_INVALID = (
        "PRINCIPALS_ROLE_INVALID",
        None,
        "a principal's role or scopes are invalid",
    )
    PRINCIPALS_TOO_MANY = "PRINCIPALS_TOO_MANY", None, "the file lists too many principals"

    # -- intent capture and the lifecycle of a proposal ------------------------------------------
    INTENT_PRINCIPAL_MISMATCH = (
        "INTENT_PRINCIPAL_MISMATCH",
        403,
        "the intent was proposed by another principal",
    )
    SEPARATION_OF_DUTIES_VIOLATED = (
        "SEPARATION_OF_DUTIES_VIOLATED",
        422,
        "a principal would approve its own proposal",
    )
    ACTION_NOT_REGISTERED = "ACTION_NOT_REGISTERED", 422, "no handler runs this action here"
    IDEMPOTENCY_KEY_CONFLICT = (
        "IDEMPOTENCY_KEY_CONFLICT",
        409,
        "the idempotency key was used for another proposal",
    )
    IDEMPOTENCY_IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS", 409, "a request with this key is in flight"
    INTENT_EXPIRED = (
        "INTENT_EXPIRED",
        None,
        "the intent is past its TTL; nothing revives it (a BLOCK's reason, never a refusal)",
    )
    RECOVERY_BINDING_MISMATCH = (
        "RECOVERY_BINDING_MISMATCH",
        409,
        "the recovery reference does not verify for this intent",
    )
    ESCALATION_NOT_CONFIGURED = (
        "ESCALATION_NOT_CONFIGURED",
        409,
        "this executor resolves no escalations (EXECUTOR_ESCALATION=NONE)",
    )
    ESCALATION_BINDING_MISMATCH = (
        "ESCALATION_BINDING_MISMATCH",
        409,
        "the escalation object belongs to another intent",
    )

    # -- host ceilings ---------------------------------------------------------------------------
    HARD_LIMIT_AMOUNT_INVALID = (
        "HARD_LIMIT_AMOUNT_INVALID",
        422,
        "the amount or currency is malformed",
    )
    HARD_LIMIT_CURRENCY_UNKNOWN = (
        "HARD_LIMIT_CURRENCY_UNKNOWN",
        422,
        "this host names no limit for the currency",
    )
    HARD_LIMIT_EXCEEDED = "HARD_LIMIT_EXCEEDED", 422, "the amount is above this host's single limit"
    HARD_LIMIT_WINDOW_COUNT_EXCEEDED = (
        "HARD_LIMIT_WINDOW_COUNT_EXCEEDED",
        422,
        "this host's action count window is full",
    )
    HARD_LIMIT_WINDOW_SUM_EXCEEDED = (
        "HARD_LIMIT_WINDOW_SUM_EXCEEDED",
        422,
        "this host's value window is full",
    )

    # -- escalation approvals (/v1/approvals) and the use store ----------------------------------
    APPROVAL_NOT_FOUND = "APPROVAL_NOT_FOUND", 404, "no such approval request for this caller"
    APPROVAL_ALREADY_DECIDED = "APPROVAL_ALREADY_DECIDED", 409, "the request is already decided"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED", 409, "the approval request or plan approval has expired"
    APPROVAL_NOT_PERMITTED = "APPROVAL_NOT_PERMITTED", 403, "this principal may not decide it"
    APPROVAL_DECISION_INVALID = (
        "APPROVAL_DECISION_INVALID",
        400,
        "the decision or reason is invalid",
    )
    APPROVAL_EXISTS = "APPROVAL_EXISTS", None, "the approval request id is taken"
    APPROVAL_INVALID = "APPROVAL_INVALID", None, "an approval operation was refused"
    APPROVAL_BINDING_MISMATCH = (
        "APPROVAL_BINDING_MISMATCH",
        422,
        "the approval is bound to another intent, plan, policy or dry run",
    )
    APPROVAL_CANCELLED = (
        "APPROVAL_CANCELLED",
        409,
        "the escalation was cancelled by its proposer or an operator",
    )
    APPROVAL_NOT_CANCELLABLE = (
        "APPROVAL_NOT_CANCELLABLE",
        409,
        "the approval request is no longer pending: decided, expired or cancelled",
    )
    APPROVAL_VERIFICATION_REQUIRED = (
        "APPROVAL_VERIFICATION_REQUIRED",
        403,
        "the decision is below the verification its rule or approver requires (a passkey)",
    )

    # -- passkeys (WebAuthn) of approvers, and their enrolment -----------------------------------
    WEBAUTHN_NOT_CONFIGURED = (
        "WEBAUTHN_NOT_CONFIGURED",
        409,
        "passkeys need EXECUTOR_APPROVAL_ORIGIN (the approval page's origin and relying party)",
    )
    WEBAUTHN_NO_CREDENTIAL = (
        "WEBAUTHN_NO_CREDENTIAL",
        409,
        "this approver has no passkey enrolled; ask an operator for an enrolment token",
    )
    WEBAUTHN_CHALLENGE_INVALID = (
        "WEBAUTHN_CHALLENGE_INVALID",
        403,
        "the passkey challenge is expired, used, or bound to another request, intent or decision",
    )
    WEBAUTHN_ASSERTION_INVALID = (
        "WEBAUTHN_ASSERTION_INVALID",
        403,
        "the passkey assertion does not verify (origin, signature, user verification, counter)",
    )
    WEBAUTHN_REGISTRATION_INVALID = (
        "WEBAUTHN_REGISTRATION_INVALID",
        400,
        "the passkey registration does not verify (origin, challenge, user verification)",
    )
    APPROVAL_NOTIFY_FAILED = (
        "APPROVAL_NOTIFY_FAILED",
        None,
        "the approval webhook did not accept the notification (the request stays pending)",
    )
    ENROLMENT_TOKEN_INVALID = (
        "ENROLMENT_TOKEN_INVALID",
        401,
        "the enrolment token is unknown, expired or already used",
    )
    ENROLMENT_PRINCIPAL_INVALID = (
        "ENROLMENT_PRINCIPAL_INVALID",
        422,
        "enrolment tokens are issued only for an APPROVER principal of the principals file",
    )
    IDEMPOTENCY_ALREADY_COMPLETE = (
        "IDEMPOTENCY_ALREADY_COMPLETE",
        None,
        "the key already has its final answer",
    )
    IDEMPOTENCY_RECORD_MISSING = "IDEMPOTENCY_RECORD_MISSING", None, "no record for this key"
    IDEMPOTENCY_TAKEN_OVER = (
        "IDEMPOTENCY_TAKEN_OVER",
        409,
        "the key's lease lapsed before its attempt opened and a later request with it took it over",
    )
    ATTEMPT_FENCED = (
        "ATTEMPT_FENCED",
        409,
        "the attempt was lost (lease lapsed or taken over) before its claim: nothing sent; retry",
    )
    ATTEMPT_LEASE_LAPSED = (
        "ATTEMPT_LEASE_LAPSED",
        None,
        "the attempt's lease would not outlive the dispatch deadline: nothing was sent",
    )
    ATTEMPT_LEASE_TOO_SHORT = (
        "ATTEMPT_LEASE_TOO_SHORT",
        None,
        "the attempt lease is too short for the dispatch deadline and renewal period; exit 78",
    )
    STORE_CLOSED = "STORE_CLOSED", None, "the use store is closed"
    STORE_RECORD_DAMAGED = "STORE_RECORD_DAMAGED", None, "a stored record is damaged"
    STORE_SCHEMA_UNSUPPORTED = "STORE_SCHEMA_UNSUPPORTED", None, "a newer agentsafe wrote the store"
    STORE_VALUE_INVALID = "STORE_VALUE_INVALID", None, "a value has no canonical JSON form"
    STORE_LOST_WRITES = (
        "STORE_LOST_WRITES",
        None,
        "the shared database lost grant claims this replica acknowledged; a halt an operator lifts",
    )

    # -- the attempt journal ---------------------------------------------------------------------
    JOURNAL_CLOSED = "JOURNAL_CLOSED", None, "the journal is closed"
    JOURNAL_CONFIG_INVALID = "JOURNAL_CONFIG_INVALID", None, "the journal's settings are invalid"
    JOURNAL_CORRUPT = "JOURNAL_CORRUPT", None, "a journal line is damaged"
    JOURNAL_LOCKED = "JOURNAL_LOCKED", None, "another process holds this journal"
    JOURNAL_RECORD_INVALID = "JOURNAL_RECORD_INVALID", None, "a record does not bind its intent"
    JOURNAL_RECORD_TOO_LARGE = "JOURNAL_RECORD_TOO_LARGE", None, "a record is over 256 KiB"

    # -- worker processes (EXECUTOR_WORKERS) -----------------------------------------------------
    WORKER_JOURNAL_UNSETTLED = (
        "WORKER_JOURNAL_UNSETTLED",
        None,
        "a journal no worker of this EXECUTOR_WORKERS opens still holds work; start with the"
        " larger N",
    )
    WORKER_REFUSED_TO_START = (
        "WORKER_REFUSED_TO_START",
        None,
        "a worker refused to start; the supervisor stopped every worker",
    )

    # -- policy, the authority and grants --------------------------------------------------------
    POLICY_EVALUATION_ERROR = (
        "POLICY_EVALUATION_ERROR",
        None,
        "a rule did not evaluate to a boolean",
    )
    POLICY_EXPRESSION_INVALID = (
        "POLICY_EXPRESSION_INVALID",
        None,
        "a CEL expression does not compile",
    )
    POLICY_FILE_UNREADABLE = "POLICY_FILE_UNREADABLE", None, "the policy file cannot be read"
    POLICY_HANDLER_UNKNOWN = (
        "POLICY_HANDLER_UNKNOWN",
        None,
        "the policy names an unregistered handler",
    )
    POLICY_TEST_INVALID = (
        "POLICY_TEST_INVALID",
        None,
        "a policy test file (agent-safe.policy-test/1) is not valid",
    )
    RULE_SHADOWED = (
        "RULE_SHADOWED",
        None,
        "lint: whenever the rule matches, an earlier rule matches too",
    )
    RULE_UNREACHABLE = (
        "RULE_UNREACHABLE",
        None,
        "lint: an earlier rule always matches, or the rule can never be true",
    )
    GRANT_ALREADY_CLAIMED = (
        "GRANT_ALREADY_CLAIMED",
        None,
        "the single-use grant was already claimed",
    )
    GRANT_BINDING_MISMATCH = "GRANT_BINDING_MISMATCH", None, "the grant is bound to another intent"
    GRANT_EXPIRED = "GRANT_EXPIRED", None, "the grant is not valid now"
    GRANT_MALFORMED = "GRANT_MALFORMED", None, "the grant is not a grant"
    GRANT_SIGNATURE_INVALID = "GRANT_SIGNATURE_INVALID", None, "the grant's signature fails"
    JWS_ALGORITHM_REFUSED = "JWS_ALGORITHM_REFUSED", None, "a token's algorithm is not EdDSA"
    JWS_KEY_UNKNOWN = "JWS_KEY_UNKNOWN", None, "a token names an unknown key"
    JWS_MALFORMED = "JWS_MALFORMED", None, "a token is not a canonical compact JWS"
    JWS_SIGNATURE_INVALID = "JWS_SIGNATURE_INVALID", None, "a token's signature does not verify"
    JWS_TYPE_MISMATCH = "JWS_TYPE_MISMATCH", None, "a token is of another type"
    KEY_INVALID = "KEY_INVALID", None, "a signing key is not a usable Ed25519 key"

    # -- verdict reasons: the reason_codes the executor itself puts in an answer ----------------
    POLICY_ALLOWED = "POLICY_ALLOWED", None, "a rule allowed and names no reason code of its own"
    POLICY_BLOCKED = "POLICY_BLOCKED", None, "a rule blocked and names no reason code of its own"
    APPROVAL_REQUIRED = (
        "APPROVAL_REQUIRED",
        None,
        "a rule escalated and names no reason code of its own",
    )
    POLICY_ACTION_UNKNOWN = "POLICY_ACTION_UNKNOWN", None, "the policy names no such action"
    POLICY_NO_MATCH = "POLICY_NO_MATCH", None, "no rule matched; blocked by default"
    PARAMETERS_INVALID = (
        "PARAMETERS_INVALID",
        None,
        "the parameters do not match the action's schema",
    )
    APPROVAL_PENDING = "APPROVAL_PENDING", None, "the escalation waits for an approver"
    APPROVAL_DENIED = "APPROVAL_DENIED", None, "an approver denied the escalation"
    APPROVED_BY_APPROVER = "APPROVED_BY_APPROVER", None, "an approver approved the escalation"
    AUTHORITY_UNAVAILABLE = (
        "AUTHORITY_UNAVAILABLE",
        None,
        "the policy authority did not answer; blocked, fail closed",
    )
    EXECUTOR_HALTED = "EXECUTOR_HALTED", 503, "a halt stopped execution; answered 503 BLOCK"
    POSTURE_DEGRADED = (
        "POSTURE_DEGRADED",
        503,
        "the host posture regressed; new work is refused with 503 BLOCK",
    )
    REGISTRY_NOT_SEALED = "REGISTRY_NOT_SEALED", None, "the handler registry is not sealed yet"
    HANDLER_FAILED = "HANDLER_FAILED", None, "the handler raised an error without a code"
    RECONCILE_FAILED = "RECONCILE_FAILED", None, "the handler's reconcile raised without a code"
    RECONCILE_TOO_EARLY = (
        "RECONCILE_TOO_EARLY",
        None,
        "'not executed' before grant expiry plus the dispatch deadline: still unknown",
    )
    RECONCILE_STORE_DISAGREES = (
        "RECONCILE_STORE_DISAGREES",
        None,
        "no GRANT_CLAIMED in the journal, but the use store claimed the grant: provider asked",
    )
    EXECUTOR_RECONCILING = (
        "EXECUTOR_RECONCILING",
        503,
        "start-up reconciliation is still running; nothing was executed; retry shortly",
    )
    ATTEMPT_NOT_OPEN = "ATTEMPT_NOT_OPEN", 404, "no open attempt has this id"
    ATTEMPT_ALREADY_DECIDED = (
        "ATTEMPT_ALREADY_DECIDED",
        409,
        "an operator's decision for this key is already journaled and says otherwise",
    )
    LOOKUP_NOT_CONFIGURED = (
        "LOOKUP_NOT_CONFIGURED",
        None,
        "no provider lookup is configured; the outcome stays unknown",
    )
    LOOKUP_KEY_UNREPRESENTABLE = (
        "LOOKUP_KEY_UNREPRESENTABLE",
        None,
        "the key cannot be placed in the lookup URL; the outcome stays unknown",
    )
    LOOKUP_STATUS = (
        "LOOKUP_STATUS",
        None,
        "sent as `LOOKUP_STATUS_<status>`: the lookup answered another status; still unknown",
    )
    RECONCILED_COMPLETED = (
        "RECONCILED_COMPLETED",
        None,
        "reconciliation learned that the action completed",
    )
    RECONCILED_NOT_EXECUTED = (
        "RECONCILED_NOT_EXECUTED",
        None,
        "reconciliation learned that the action did not execute",
    )

    # -- the gateway (agentsafe proxy) ---------------------------------------------------------
    GATEWAY_BLOCKED = "GATEWAY_BLOCKED", 403, "the policy refused the intercepted request"
    GATEWAY_AUTHORITY_UNAVAILABLE = (
        "GATEWAY_AUTHORITY_UNAVAILABLE",
        503,
        "the authority could not be reached: not a verdict; nothing was forwarded",
    )
    GATEWAY_STREAMING_REFUSED = (
        "GATEWAY_STREAMING_REFUSED",
        411,
        "a streaming (Transfer-Encoding) body cannot be bound to an intent",
    )
    GATEWAY_BODY_TOO_LARGE = "GATEWAY_BODY_TOO_LARGE", 413, "the body is over 100 KiB"
    GATEWAY_UPGRADE_REFUSED = (
        "GATEWAY_UPGRADE_REFUSED",
        400,
        "a protocol upgrade or CONNECT is not intercepted",
    )
    GATEWAY_METHOD_REFUSED = "GATEWAY_METHOD_REFUSED", 405, "the method is not intercepted"
    GATEWAY_OUTCOME_UNKNOWN = (
        "GATEWAY_OUTCOME_UNKNOWN",
        502,
        "the request was forwarded and its outcome is unknown; it is never sent again",
    )
    GATEWAY_NOT_EXECUTED = "GATEWAY_NOT_EXECUTED", 502, "the request was not forwarded"
    GATEWAY_UPSTREAM_UNREACHABLE = (
        "GATEWAY_UPSTREAM_UNREACHABLE",
        502,
        "a pass-through request could not reach the upstream",
    )
    GATEWAY_EXCHANGE_LOST = (
        "GATEWAY_EXCHANGE_LOST",
        None,
        "the captured request is not held by this process; nothing was sent",
    )
    GATEWAY_PATH_AMBIGUOUS = (
        "GATEWAY_PATH_AMBIGUOUS",
        400,
        "the request path is ambiguous (escaped separator, dot or empty segment, backslash)",
    )
    GATEWAY_METHOD_OVERRIDE_REFUSED = (
        "GATEWAY_METHOD_OVERRIDE_REFUSED",
        400,
        "a method-override header or _method field is refused",
    )
    GATEWAY_BODY_UNREADABLE = (
        "GATEWAY_BODY_UNREADABLE",
        422,
        "the body is not a strict JSON document the policy can read; nothing was sent",
    )
    GATEWAY_READ_BODY_REFUSED = (
        "GATEWAY_READ_BODY_REFUSED",
        400,
        "a read that passes unbound carries a body the policy would never see",
    )
    GATEWAY_HELD_REQUEST_CONFLICT = (
        "GATEWAY_HELD_REQUEST_CONFLICT",
        409,
        "another request under the key of one held or in flight; the held one is kept",
    )
    GATEWAY_ANSWER_WITHHELD = (
        "GATEWAY_ANSWER_WITHHELD",
        502,
        "the upstream's answer carried a credential and is withheld",
    )

    # -- dispatch: the handler seam --------------------------------------------------------------
    ACTION_ALREADY_REGISTERED = "ACTION_ALREADY_REGISTERED", None, "an action is registered twice"
    NAME_INVALID = "NAME_INVALID", None, "an action name is not a short identifier"
    REGISTRY_SEALED = "REGISTRY_SEALED", 422, "the registry is sealed"
    HANDLER_REGISTRATION_FAILED = (
        "HANDLER_REGISTRATION_FAILED",
        None,
        "a registration function (EXECUTOR_HANDLERS) failed; the executor refuses to start",
    )
    SCHEMA_INVALID = "SCHEMA_INVALID", None, "a parameter schema is not valid JSON Schema"
    SCHEMA_NOT_STRICT = "SCHEMA_NOT_STRICT", None, "a parameter schema is not strict"
    DISPATCH_REFUSED = "DISPATCH_REFUSED", None, "dispatch would not start"
    DISPATCH_TWICE = "DISPATCH_TWICE", None, "dispatch runs once per execution"
    SEND_BEFORE_DISPATCH = (
        "SEND_BEFORE_DISPATCH",
        None,
        "a handler sent through seam.fetch before dispatch.run; refused, nothing was sent",
    )
    PROVIDER_REFUSED = "PROVIDER_REFUSED", None, "the provider refused deterministically"
    BASE64_NOT_CANONICAL = (
        "BASE64_NOT_CANONICAL",
        None,
        "a value is not the canonical base64 or base64url spelling of any bytes",
    )
    PROVIDER_REASON_WITHHELD = (
        "PROVIDER_REASON_WITHHELD",
        None,
        "the provider's reason was not a bounded UPPER_SNAKE code, or carried a secret; withheld",
    )
    PROVIDER_REDIRECT = "PROVIDER_REDIRECT", None, "the provider answered a redirect"
    PROVIDER_ERROR = "PROVIDER_ERROR", None, "the provider answered 5xx; the outcome is unknown"
    PROVIDER_ANSWER_INDETERMINATE = (
        "PROVIDER_ANSWER_INDETERMINATE",
        None,
        "the provider's answer does not say what happened",
    )
    CREDENTIAL_INVALID = "CREDENTIAL_INVALID", None, "a credential set a reserved header"

    # -- the effect plane and the banking family -------------------------------------------------
    EFFECT_MISMATCH = (
        "EFFECT_MISMATCH",
        None,
        "the observed effect (or the provider's receipt) is not the authorised one",
    )
    EFFECT_RECEIPT_INVALID = (
        "EFFECT_RECEIPT_INVALID",
        None,
        "the provider's effect receipt does not verify against its registered key",
    )
    EFFECT_RECEIPT_ISSUER_MISMATCH = (
        "EFFECT_RECEIPT_ISSUER_MISMATCH",
        None,
        "the effect receipt's issuer is not the one its key is registered for",
    )
    EFFECT_RECEIPT_GRANT_MISMATCH = (
        "EFFECT_RECEIPT_GRANT_MISMATCH",
        None,
        "the effect receipt names another grant",
    )
    EFFECT_RECEIPT_CLAIM_MISMATCH = (
        "EFFECT_RECEIPT_CLAIM_MISMATCH",
        None,
        "the effect receipt answers another claim (claim_token_digest)",
    )
    EFFECT_RECEIPT_STATUS_MISMATCH = (
        "EFFECT_RECEIPT_STATUS_MISMATCH",
        None,
        "the effect receipt's status contradicts the provider's answer",
    )
    EFFECT_RECEIPT_DIGEST_MISMATCH = (
        "EFFECT_RECEIPT_DIGEST_MISMATCH",
        None,
        "the effect receipt's effect digest is not the authorised (or the observed) effect",
    )
    PROVIDER_KEY_INVALID = (
        "PROVIDER_KEY_INVALID",
        None,
        "a provider key in the policy is not a 32-byte Ed25519 public key",
    )
    BANKING_ACTION_INVALID = (
        "BANKING_ACTION_INVALID",
        422,
        "the parameters are not a canonical banking action of this action's type",
    )
    ACTION_TARGET_MISMATCH = (
        "ACTION_TARGET_MISMATCH",
        422,
        "the proposal's target is not the one its action derives; nothing was asked",
    )
    BANKING_CURRENCY_UNKNOWN = (
        "BANKING_CURRENCY_UNKNOWN",
        422,
        "the currency is not an ISO 4217 code with minor units",
    )
    BANKING_AMOUNT_INVALID = (
        "BANKING_AMOUNT_INVALID",
        422,
        "the amount is not a positive integer of minor units",
    )
    BANKING_IBAN_INVALID = (
        "BANKING_IBAN_INVALID",
        422,
        "an iban: reference fails its check digits or its country's length",
    )
    BANKING_BIC_INVALID = "BANKING_BIC_INVALID", 422, "a BIC is not in the ISO 9362 format"
    READ_BACK_FAILED = (
        "READ_BACK_FAILED",
        None,
        "the posted effect could not be read back by its reference; it stays unconfirmed",
    )

    # -- egress and downstream credentials -------------------------------------------------------
    EGRESS_ADDRESS_REFUSED = "EGRESS_ADDRESS_REFUSED", None, "the destination address is refused"
    EGRESS_BODY_TOO_LARGE = "EGRESS_BODY_TOO_LARGE", None, "the response body is too large"
    EGRESS_INIT_UNSUPPORTED = (
        "EGRESS_INIT_UNSUPPORTED",
        None,
        "the request uses something unsupported",
    )
    EGRESS_ORIGIN_NOT_ALLOWED = "EGRESS_ORIGIN_NOT_ALLOWED", None, "the origin is not allowed"
    EGRESS_PATH_NOT_ALLOWED = "EGRESS_PATH_NOT_ALLOWED", None, "the path is not allowed"
    EGRESS_REDIRECT_REFUSED = "EGRESS_REDIRECT_REFUSED", None, "a redirect is refused, not followed"
    EGRESS_RESPONSE_INVALID = "EGRESS_RESPONSE_INVALID", None, "the response is not valid HTTP"
    EGRESS_SCHEME_NOT_ALLOWED = "EGRESS_SCHEME_NOT_ALLOWED", None, "the scheme is not allowed"
    EGRESS_TIMEOUT = "EGRESS_TIMEOUT", None, "the outbound request timed out"
    EGRESS_TLS_PIN_MISMATCH = "EGRESS_TLS_PIN_MISMATCH", None, "the peer's key matches no pin"
    EGRESS_TLS_REJECTED = "EGRESS_TLS_REJECTED", None, "the TLS handshake failed"
    TRANSPORT_CONNECTION_LOST = (
        "TRANSPORT_CONNECTION_LOST",
        None,
        "the connection failed mid-exchange",
    )
    TRANSPORT_CONNECT_FAILED = "TRANSPORT_CONNECT_FAILED", None, "the peer could not be reached"
    TRANSPORT_FAILED = "TRANSPORT_FAILED", None, "an outbound request failed"
    DOWNSTREAM_CREDENTIAL_UNAVAILABLE = (
        "DOWNSTREAM_CREDENTIAL_UNAVAILABLE",
        None,
        "the credential produced no headers; nothing was sent",
    )
    DOWNSTREAM_TOKEN_UNAVAILABLE = (
        "DOWNSTREAM_TOKEN_UNAVAILABLE",
        None,
        "the token endpoint's answer is unusable",
    )
    SIGNATURE_INPUT_INVALID = (
        "SIGNATURE_INPUT_INVALID",
        None,
        "a signed request cannot be built from this dispatch",
    )

    # -- RFC 9421 signatures and the provider's verifier -----------------------------------------
    SIGNATURE_ALGORITHM_MISMATCH = (
        "SIGNATURE_ALGORITHM_MISMATCH",
        None,
        "the key does not match the algorithm",
    )
    SIGNATURE_ALGORITHM_UNSUPPORTED = (
        "SIGNATURE_ALGORITHM_UNSUPPORTED",
        None,
        "unsupported algorithm",
    )
    SIGNATURE_INVALID = "SIGNATURE_INVALID", None, "the request signature does not verify"
    SIGNATURE_MALFORMED = (
        "SIGNATURE_MALFORMED",
        None,
        "a signature header or parameter is malformed",
    )
    SIGNATURE_MISSING = "SIGNATURE_MISSING", None, "the request carries no signature"
    CONTENT_DIGEST_MALFORMED = "CONTENT_DIGEST_MALFORMED", None, "Content-Digest is malformed"
    CONTENT_DIGEST_MISMATCH = (
        "CONTENT_DIGEST_MISMATCH",
        None,
        "Content-Digest differs from the body",
    )
    CONTENT_DIGEST_MISSING = "CONTENT_DIGEST_MISSING", None, "Content-Digest is missing"
    COMPONENT_NOT_COVERED = (
        "COMPONENT_NOT_COVERED",
        None,
        "the signature leaves a component uncovered",
    )
    CREATED_OUT_OF_WINDOW = (
        "CREATED_OUT_OF_WINDOW",
        None,
        "the signature's created is out of window",
    )
    HEADER_DUPLICATED = "HEADER_DUPLICATED", None, "a covered header appears twice"
    HEADER_MISSING = "HEADER_MISSING", None, "a covered header is absent"
    KEY_UNKNOWN = "KEY_UNKNOWN", None, "the signature names an unknown key"
    ATTESTATION_ALGORITHM_INVALID = (
        "ATTESTATION_ALGORITHM_INVALID",
        None,
        "the claim attestation's alg is not EdDSA",
    )
    ATTESTATION_DECISION_MISMATCH = (
        "ATTESTATION_DECISION_MISMATCH",
        None,
        "the attestation names another decision",
    )
    ATTESTATION_EXPIRED = "ATTESTATION_EXPIRED", None, "the attestation's lease is over"
    ATTESTATION_GRANT_MISMATCH = "ATTESTATION_GRANT_MISMATCH", None, "it names another grant"
    ATTESTATION_INTENT_MISMATCH = "ATTESTATION_INTENT_MISMATCH", None, "it names another intent"
    ATTESTATION_KEY_UNKNOWN = "ATTESTATION_KEY_UNKNOWN", None, "it names an unknown authority key"
    ATTESTATION_MALFORMED = "ATTESTATION_MALFORMED", None, "the attestation is malformed"
    ATTESTATION_PAYLOAD_MISMATCH = (
        "ATTESTATION_PAYLOAD_MISMATCH",
        None,
        "the body is not the attested payload",
    )
    ATTESTATION_PROFILE_UNSUPPORTED = (
        "ATTESTATION_PROFILE_UNSUPPORTED",
        None,
        "its canonicalization profile is unsupported",
    )
    ATTESTATION_REPLAYED = "ATTESTATION_REPLAYED", None, "the attestation was presented before"
    ATTESTATION_SIGNATURE_INVALID = (
        "ATTESTATION_SIGNATURE_INVALID",
        None,
        "the attestation's signature does not verify",
    )
    ATTESTATION_TYPE_INVALID = (
        "ATTESTATION_TYPE_INVALID",
        None,
        "its typ is not a claim attestation",
    )
    VERIFIED = "VERIFIED", None, "the provider request verified (the verifier's acceptance)"

    # -- evidence --------------------------------------------------------------------------------
    CHAIN_CLOSED = "CHAIN_CLOSED", None, "the evidence stream is closed"
    CHAIN_HEAD_UNREADABLE = "CHAIN_HEAD_UNREADABLE", None, "a stream's chain head is unreadable"
    CHAIN_JOURNAL = "CHAIN_JOURNAL", None, "a chain head cannot be persisted"
    CHAIN_JOURNAL_IN_USE = "CHAIN_JOURNAL_IN_USE", None, "another process holds the chain journal"
    CHAIN_UNAVAILABLE = "CHAIN_UNAVAILABLE", None, "the chain cannot continue safely"
    CHAIN_HEADS_UNAVAILABLE = (
        "CHAIN_HEADS_UNAVAILABLE",
        503,
        "the chain heads cannot be persisted (a full disk); the executor halts (CHAIN_HEADS)",
    )
    EVENT_RESERVED = "EVENT_RESERVED", None, "the event name is the chain's own"
    FIELD_RESERVED = "FIELD_RESERVED", None, "a field name is the chain's own"
    EVIDENCE_DIR = "EVIDENCE_DIR", 409, "the evidence directory is unusable"
    EVIDENCE_EXPORT_FAILED = "EVIDENCE_EXPORT_FAILED", 409, "the bundle could not be written"
    EVIDENCE_REASON_INVALID = "EVIDENCE_REASON_INVALID", 409, "the export reason is invalid"
    EVIDENCE_NOT_CONFIGURED = "EVIDENCE_NOT_CONFIGURED", 409, "export needs EXECUTOR_EVIDENCE_DIR"
    EVIDENCE_NOT_CHAINED = "EVIDENCE_NOT_CHAINED", 409, "this process writes no chained streams"
    EVIDENCE_KEY_INVALID = "EVIDENCE_KEY_INVALID", 409, "the evidence signing key is not Ed25519"

    # -- the host: secrets, posture, the process guard, TLS, the halt ----------------------------
    SECRET_BOTH_GIVEN = "SECRET_BOTH_GIVEN", None, "a secret is given both inline and as a file"
    SECRET_DIR_INVALID = "SECRET_DIR_INVALID", None, "EXECUTOR_SECRETS_DIR is not a directory"
    SECRET_DIR_REQUIRED = "SECRET_DIR_REQUIRED", None, "secret files need EXECUTOR_SECRETS_DIR"
    SECRET_DIR_UNSAFE = (
        "SECRET_DIR_UNSAFE",
        None,
        "EXECUTOR_SECRETS_DIR is the root, a system tree, writable by others or the state's",
    )
    SECRET_DISPOSED = "SECRET_DISPOSED", None, "a rotated-out secret handle was revealed"
    SECRET_EMPTY = "SECRET_EMPTY", None, "a secret is empty"
    SECRET_FILE_MODE = "SECRET_FILE_MODE", None, "a secret file is readable beyond its owner"
    SECRET_FILE_OUTSIDE_DIR = "SECRET_FILE_OUTSIDE_DIR", None, "a secret file is outside the dir"
    SECRET_FILE_OWNER = "SECRET_FILE_OWNER", None, "a secret file has an unexpected owner"
    SECRET_FILE_TOO_LARGE = "SECRET_FILE_TOO_LARGE", None, "a secret file is larger than 1 MiB"
    SECRET_FILE_UNREADABLE = "SECRET_FILE_UNREADABLE", None, "a secret file cannot be read"
    SECRET_FILE_UNSTABLE = "SECRET_FILE_UNSTABLE", None, "a secret file kept changing while read"
    SECRET_IN_ENV = "SECRET_IN_ENV", None, "a secret is in the environment in production"
    REFUSED_TO_START = "REFUSED_TO_START", None, "the host does not hold the required posture"
    GUARD_ALREADY_INSTALLED = "GUARD_ALREADY_INSTALLED", None, "the process guard is installed"
    GUARD_INVALID = "GUARD_INVALID", None, "the process guard cannot be installed"
    GUARD_CONNECT_REFUSED = "GUARD_CONNECT_REFUSED", None, "the guard refused a connection"
    GUARD_CHILD_PROCESS_REFUSED = "GUARD_CHILD_PROCESS_REFUSED", None, "the guard refused a process"
    GUARD_FS_WRITE_REFUSED = "GUARD_FS_WRITE_REFUSED", None, "the guard refused a file write"
    TLS_CLIENT_CA_INVALID = "TLS_CLIENT_CA_INVALID", None, "the client CA file cannot be loaded"
    TLS_MATERIAL_INVALID = "TLS_MATERIAL_INVALID", None, "the TLS certificate or key is unusable"
    REASON_REQUIRED = "REASON_REQUIRED", 422, "a halt or resume needs a reason"
    HALT_CAUSE_PERSISTS = "HALT_CAUSE_PERSISTS", 409, "the cause of the halt still stands"

    # -- canonical JSON --------------------------------------------------------------------------
    NUMBER_NOT_FINITE = "NUMBER_NOT_FINITE", None, "a number is not finite"
    NUMBER_OUT_OF_RANGE = "NUMBER_OUT_OF_RANGE", None, "an integer is outside the exact range"
    JSON_INVALID = "JSON_INVALID", 400, "a value is not valid JSON data"
    JSON_TOO_DEEP = "JSON_TOO_DEEP", 400, "a value nests too deeply"
    JSON_DUPLICATE_KEY = "JSON_DUPLICATE_KEY", None, "a JSON text names one key twice in an object"

    # -- the plan boundary -----------------------------------------------------------------------
    AGENT_SAFETY_REFUSED = "AGENT_SAFETY_REFUSED", 422, "the plan boundary refused"
    OPERATION_ABORTED = "OPERATION_ABORTED", 499, "the caller's abort event fired"
    OPERATION_CANCELLED = "OPERATION_CANCELLED", None, "a step was cancelled (audit errorCode)"
    EXECUTION_FAILED = "EXECUTION_FAILED", 422, "a step ran and failed; the receipt is beside it"
    JSON_COLLECTION_TOO_LONG = "JSON_COLLECTION_TOO_LONG", 400, "an array or object is too long"
    JSON_NUMBER_INVALID = "JSON_NUMBER_INVALID", 400, "a number is out of range or not finite"
    JSON_TOO_LARGE = "JSON_TOO_LARGE", 400, "a value is too large"
    JSON_TOO_MANY_CONTAINERS = "JSON_TOO_MANY_CONTAINERS", 400, "a value has too many containers"
    JSON_TOO_MANY_NODES = "JSON_TOO_MANY_NODES", 400, "a value has too many nodes"
    JSON_TYPE_REFUSED = "JSON_TYPE_REFUSED", 400, "a value is not plain JSON data"
    TIME_INVALID = "TIME_INVALID", 400, "a time is not a timestamp or epoch seconds"
    TIMESTAMP_INVALID = "TIMESTAMP_INVALID", 400, "a timestamp is malformed"
    POLICY_DIGEST_MISMATCH = (
        "POLICY_DIGEST_MISMATCH",
        422,
        "the dry run was made under another policy",
    )
    PLAN_INVALID = "PLAN_INVALID", 400, "the plan is malformed"
    PLAN_BINDING_CONFLICT = "PLAN_BINDING_CONFLICT", 422, "a step's source binding conflicts"
    PLAN_BINDING_DRIFT = "PLAN_BINDING_DRIFT", 422, "a source version the policy does not allow"
    PLAN_DUPLICATE = "PLAN_DUPLICATE", 422, "a plan list has duplicates"
    PLAN_EFFECT_NOT_ALLOWED = "PLAN_EFFECT_NOT_ALLOWED", 422, "a step's effect is not allowed"
    PLAN_FIELD_NOT_ALLOWED = "PLAN_FIELD_NOT_ALLOWED", 422, "a step reads a field not allowed"
    PLAN_LIMIT_EXCEEDED = "PLAN_LIMIT_EXCEEDED", 422, "the plan exceeds a policy limit"
    PLAN_OPERATION_DIGEST_MISMATCH = (
        "PLAN_OPERATION_DIGEST_MISMATCH",
        422,
        "a step's operationDigest does not match its fields",
    )
    PLAN_PROVENANCE_INVALID = "PLAN_PROVENANCE_INVALID", 400, "a source's provenance is malformed"
    PLAN_PROVENANCE_STALE = "PLAN_PROVENANCE_STALE", 422, "a source's provenance is stale"
    PLAN_SOURCE_UNKNOWN = "PLAN_SOURCE_UNKNOWN", 422, "a step names an unknown source"
    PLAN_TOOL_NOT_ALLOWED = "PLAN_TOOL_NOT_ALLOWED", 422, "a step's tool is not allowed"
    CITATION_REFUSED = "CITATION_REFUSED", 422, "a citation is outside the allowlist"
    STEP_UNKNOWN = "STEP_UNKNOWN", 422, "the step is not in the plan"
    DRY_RUN_MISMATCH = "DRY_RUN_MISMATCH", 422, "the dry run no longer validates"
    APPROVAL_REQUEST_INVALID = "APPROVAL_REQUEST_INVALID", 400, "the approval request is malformed"
    APPROVAL_MALFORMED = "APPROVAL_MALFORMED", 400, "the approval is malformed"
    APPROVAL_AMBIGUOUS_NARROWING = (
        "APPROVAL_AMBIGUOUS_NARROWING",
        422,
        "narrow a multi-step plan with stepLimits only",
    )
    APPROVAL_WIDENS = "APPROVAL_WIDENS", 422, "an approval may narrow limits, never widen them"
    APPROVAL_LIFETIME_EXCEEDED = "APPROVAL_LIFETIME_EXCEEDED", 422, "the approval lives too long"
    APPROVAL_CLOCK_SKEW = "APPROVAL_CLOCK_SKEW", 422, "issuedAt is too far from now"
    APPROVAL_NOT_YET_VALID = "APPROVAL_NOT_YET_VALID", 403, "the approval is not yet valid"
    APPROVAL_SIGNATURE_INVALID = "APPROVAL_SIGNATURE_INVALID", 403, "the approval's signature fails"
    APPROVAL_KEY_MISMATCH = "APPROVAL_KEY_MISMATCH", 403, "the approval was signed by another key"
    APPROVAL_ALREADY_USED = "APPROVAL_ALREADY_USED", 409, "this approval already ran this step"
    APPROVER_MISMATCH = "APPROVER_MISMATCH", 403, "the request names another approver"
    PLAN_PRINCIPAL_MISMATCH = (
        "PLAN_PRINCIPAL_MISMATCH",
        403,
        "the plan's actor is not the calling principal: a plan is dry-run and stepped by its own",
    )
    CONTEXT_INVALID = "CONTEXT_INVALID", 400, "the source context is malformed"
    CONTEXT_MISMATCH = "CONTEXT_MISMATCH", 422, "the context does not bind the step's source"
    CONTEXT_STALE = "CONTEXT_STALE", 422, "the source context is not fresh"
    OPERATION_INVALID = "OPERATION_INVALID", 400, "the operation is malformed"
    OPERATION_MISMATCH = "OPERATION_MISMATCH", 422, "the operation is not the approved one"
    OPERATION_PARAMETERS_EXCEEDED = (
        "OPERATION_PARAMETERS_EXCEEDED",
        422,
        "the operation parameters exceed the policy",
    )
    EXECUTION_ID_INVALID = "EXECUTION_ID_INVALID", 400, "the execution id is not an identifier"
    EXECUTOR_INVALID = "EXECUTOR_INVALID", 400, "a step executor names no single tool and effect"
    EXECUTOR_DUPLICATE = "EXECUTOR_DUPLICATE", 422, "a step executor is registered twice"
    EXECUTOR_MISMATCH = "EXECUTOR_MISMATCH", 422, "the executor is bound to another tool or effect"
    EXECUTOR_NOT_REGISTERED = "EXECUTOR_NOT_REGISTERED", 422, "no executor runs this step"
    EXECUTOR_FAILED = "EXECUTOR_FAILED", 502, "the step executor failed"
    RESULT_BYTES_EXCEEDED = "RESULT_BYTES_EXCEEDED", 502, "the result is larger than approved"
    RESULT_INVALID = "RESULT_INVALID", 502, "the executor did not return a valid StepResult"
    RESULT_ROWS_EXCEEDED = "RESULT_ROWS_EXCEEDED", 502, "the result has more rows than approved"
    RESULT_UNCOUNTED = "RESULT_UNCOUNTED", 502, "the executor did not count its rows"
    USE_STORE_INVALID = "USE_STORE_INVALID", 400, "the use store lacks a required method"
    USE_STORE_FAILED = "USE_STORE_FAILED", 503, "the use store failed"
    AUDIT_SINK_INVALID = "AUDIT_SINK_INVALID", 400, "the audit sink lacks append"
    AUDIT_START_FAILED = "AUDIT_START_FAILED", 503, "the started event was not persisted"
    AUDIT_COMPLETE_FAILED = "AUDIT_COMPLETE_FAILED", 503, "the completed event was not persisted"
    CLOCK_INVALID = "CLOCK_INVALID", 400, "the clock lacks now"
    CANCEL_INVALID = "CANCEL_INVALID", 400, "cancel is not an asyncio.Event"
    SKEW_INVALID = "SKEW_INVALID", 400, "max_clock_skew_ms is out of range"
    SIGNER_INVALID = "SIGNER_INVALID", 400, "the signer cannot sign"
    VERIFIER_INVALID = "VERIFIER_INVALID", 400, "the verifier cannot verify"
    SIGNER_FAILED = "SIGNER_FAILED", 503, "the signer failed"
    VERIFIER_FAILED = "VERIFIER_FAILED", 503, "the verifier failed"
    RECEIPT_MALFORMED = "RECEIPT_MALFORMED", 400, "the receipt is malformed"
    RECEIPT_MISMATCH = "RECEIPT_MISMATCH", 422, "the receipt is for another approval or step"
    RECEIPT_REFUSED = "RECEIPT_REFUSED", 500, "the step ran but no receipt could be signed"
    RECEIPT_SIGNATURE_INVALID = "RECEIPT_SIGNATURE_INVALID", 422, "the receipt's signature fails"
    RECEIPT_KEY_MISMATCH = "RECEIPT_KEY_MISMATCH", 422, "the receipt was signed by another key"
    CONSUMPTION_INVALID = "CONSUMPTION_INVALID", 400, "the consumption record is malformed"
    CONSUMPTION_MISMATCH = "CONSUMPTION_MISMATCH", 422, "the consumption is for another use"
    CONSUMPTION_UNVERIFIED = "CONSUMPTION_UNVERIFIED", 422, "the consumption is not authentic"
    EVIDENCE_INVALID = "EVIDENCE_INVALID", 400, "the receipt's evidence is malformed"
    EVIDENCE_EXCEEDS_APPROVAL = (
        "EVIDENCE_EXCEEDS_APPROVAL",
        422,
        "the evidence exceeds the approved rows or bytes",
    )
    MCP_ARGUMENTS_INVALID = "MCP_ARGUMENTS_INVALID", 502, "MCP tool arguments are not an object"
    MCP_COUNT_ROWS_REQUIRED = "MCP_COUNT_ROWS_REQUIRED", 502, "an MCP executor needs count_rows"
    MCP_RESULT_UNCOUNTED = "MCP_RESULT_UNCOUNTED", 502, "count_rows could not count the result"
    MCP_TIMEOUT_INVALID = "MCP_TIMEOUT_INVALID", 502, "the MCP timeout is out of range"
    MCP_TOOL_ERROR = "MCP_TOOL_ERROR", 502, "the MCP tool reported an error"
    MCP_TOOL_NAME_INVALID = "MCP_TOOL_NAME_INVALID", 502, "the MCP tool name is not exact"
    MCP_TOOL_NOT_READ_ONLY = "MCP_TOOL_NOT_READ_ONLY", 502, "the MCP tool is not read-only"
    MCP_TOOL_UNKNOWN = "MCP_TOOL_UNKNOWN", 502, "the MCP server has no such tool"

    # -- operations: the readiness probe and the operator process --------------------------------
    READY = "READY", None, "GET /ready: the executor takes proposals (200)"
    RECONCILING = "RECONCILING", None, "GET /ready: startup reconciliation is still running (503)"
    UNKNOWN_ATTEMPTS_OPEN = (
        "UNKNOWN_ATTEMPTS_OPEN",
        None,
        "GET /ready: attempts of unknown outcome are open and readiness requires none (503)",
    )
    KUBE_CREDENTIALS_MISSING = (
        "KUBE_CREDENTIALS_MISSING",
        None,
        "the operator found no Kubernetes credentials (service account or kubeconfig); exit 78",
    )
    OPERATOR_START_FAILED = (
        "OPERATOR_START_FAILED",
        None,
        "the operator could not start (its log says why); exit 1",
    )


REASON_CODES: Final[frozenset[Code]] = frozenset(
    {
        # the policy authority's verdicts
        Code.POLICY_ALLOWED,
        Code.POLICY_BLOCKED,
        # the effect plane
        Code.EFFECT_MISMATCH,
        Code.APPROVAL_REQUIRED,
        Code.POLICY_ACTION_UNKNOWN,
        Code.POLICY_NO_MATCH,
        Code.POLICY_EVALUATION_ERROR,
        Code.PARAMETERS_INVALID,
        Code.INTENT_EXPIRED,
        Code.APPROVAL_BINDING_MISMATCH,
        Code.SEPARATION_OF_DUTIES_VIOLATED,
        Code.APPROVAL_PENDING,
        Code.APPROVAL_DENIED,
        Code.APPROVAL_EXPIRED,
        Code.APPROVAL_CANCELLED,
        Code.APPROVAL_VERIFICATION_REQUIRED,
        Code.APPROVED_BY_APPROVER,
        Code.AUTHORITY_UNAVAILABLE,
        # the work gate
        Code.EXECUTOR_HALTED,
        Code.POSTURE_DEGRADED,
        Code.STORE_UNAVAILABLE,
        # the handler seam and reconciliation
        Code.REGISTRY_NOT_SEALED,
        Code.ACTION_NOT_REGISTERED,
        Code.GRANT_BINDING_MISMATCH,
        Code.JOURNAL_UNAVAILABLE,
        Code.ATTEMPT_LEASE_LAPSED,
        Code.HANDLER_FAILED,
        Code.HANDLER_CONTRACT_VIOLATED,
        Code.SEND_BEFORE_DISPATCH,
        Code.RECONCILE_FAILED,
        Code.PROVIDER_REASON_WITHHELD,
        Code.INTERNAL_ERROR,
        Code.RECONCILE_TOO_EARLY,
        Code.RECONCILE_STORE_DISAGREES,
        Code.EXECUTOR_RECONCILING,
        Code.LOOKUP_NOT_CONFIGURED,
        Code.LOOKUP_KEY_UNREPRESENTABLE,
        Code.LOOKUP_STATUS,
        Code.RECONCILED_COMPLETED,
        Code.RECONCILED_NOT_EXECUTED,
    }
)
"""The reason codes the executor itself emits in a verdict's ``reason_codes`` or a reconciliation's
``reason_code`` (``LOOKUP_STATUS`` is a prefix: ``LOOKUP_STATUS_503``). Besides these, a handler's
failure is reported by its error's own code (an egress, transport or provider code)."""

ADMISSION_CODES: Final[frozenset[Code]] = frozenset(
    {
        Code.ACTION_TARGET_MISMATCH,
        Code.BANKING_ACTION_INVALID,
        Code.BANKING_CURRENCY_UNKNOWN,
        Code.BANKING_AMOUNT_INVALID,
        Code.BANKING_IBAN_INVALID,
        Code.BANKING_BIC_INVALID,
    }
)
"""What a handler that derives its action refuses a proposal with before the authority is asked
(``dispatch/seam.Registry.admit``: the effect plane's bridge, ``effects/adapter.py``, and the
banking family's checks, ``banking/actions.py``); each is 422 and changes nothing."""

WORK_GATE_CODES: Final[frozenset[Code]] = frozenset(
    {
        Code.POSTURE_DEGRADED,
        Code.EXECUTOR_HALTED,
        Code.STORE_UNAVAILABLE,
        Code.EXECUTOR_RECONCILING,
    }
)
"""The codes of the work gate (``plane.WorkGate``): why new work is refused right now. Each is
answered 503 with ``Retry-After``: a verdict's reason on ``/v1/actions``, a refusal on the plan
step route."""
