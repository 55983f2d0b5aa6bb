"""Loading ``agent-safe.principals/1``: who may call the executor and how each proves it.

The file (``EXECUTOR_PRINCIPALS_FILE``) is JSON, at most 200 principals, checked for its mode and
owner like a secret although it holds none: a regular file, not writable by group or others, owned
by the process's user or root. Its schema is strict (:class:`PrincipalsDocument`, pydantic, extra
keys forbidden) and every semantic rule is a refusal to start raised as
:class:`PrincipalsFileError` (a :class:`~agentsafe.executor.errors.ConfigError`) with a stable
code and, where one principal is at fault, that principal's id, never a credential value:

    PRINCIPALS_FILE_MODE, PRINCIPALS_FILE_OWNER, PRINCIPALS_FILE_UNREADABLE,
    PRINCIPALS_FILE_TOO_LARGE, PRINCIPALS_FILE_INVALID (schema), PRINCIPALS_TOO_MANY,
    PRINCIPALS_DUPLICATE_ID, PRINCIPALS_CREDENTIAL_SHARED, PRINCIPALS_ROLE_INVALID,
    PRINCIPALS_ACTION_UNKNOWN, PRINCIPALS_JWT_UNCONFIGURED, PRINCIPALS_MTLS_UNCONFIGURED,
    PRINCIPALS_RATE_LIMIT_INVALID, PRINCIPALS_ACTOR_COLLISION, SEPARATION_OF_DUTIES_VIOLATED

Principal ids and actor ids are compared as :func:`~agentsafe.executor.principals.actor_key`
writes them (Unicode compatibility caseless match, default-ignorables removed; issue 30): a file
in which two principals spell one name differently (``Mallory@Bank.example`` and
``mallory@bank.example``, as an id or an actor id) is refused with PRINCIPALS_ACTOR_COLLISION,
naming the later principal and the earlier one by id, never the names compared; the separation of
duties below compares under the same key.

The result is a :class:`PrincipalSet`, the door's lookup table: bearer tokens by digest compared
in constant time against every bearer principal, workload tokens by (issuer, subject),
certificates by SAN URI. Reloading is loading again and swapping the set.

An APPROVER may carry ``"approval": {"verification": "WEBAUTHN"}``: its decisions must then be
made with a passkey assertion (issue 21); its passkeys live in the use store, never in this file.

Callers: ``assembly.py`` (loads the file at start, and binds the loader the control plane runs
on ``POST /v1/control/secrets/reload``), ``door/door.py``, ``door/workload.py``, the operator
(renders the same :class:`PrincipalsDocument`).
Also imported by ``plane.py``, ``operator/models.py``, ``operator/render/config.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..codes import Code
from ..errors import ConfigError
from ..principals import Actor, Principal, Role, Scope, Verification, actor_key
from ..windows import RateRule

__all__ = [
    "MAX_ALLOWED_ACTIONS",
    "MAX_PRINCIPALS",
    "MAX_SCOPES",
    "PRINCIPALS_VERSION",
    "ActorModel",
    "BearerCredential",
    "MtlsCredential",
    "PrincipalEntry",
    "PrincipalRecord",
    "PrincipalSet",
    "PrincipalsDocument",
    "PrincipalsFileError",
    "SanUri",
    "Sha256Hex",
    "WorkloadJwtCredential",
    "load_principals_file",
    "parse_principals",
    "render_principals_file",
]

PRINCIPALS_VERSION = "agent-safe.principals/1"
MAX_PRINCIPALS = 200
MAX_FILE_BYTES = 1024 * 1024
VARIABLE = "EXECUTOR_PRINCIPALS_FILE"

_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
MAX_ALLOWED_ACTIONS: Final = 1000
MAX_SCOPES: Final = 16
_HEX64 = r"^[0-9a-f]{64}$"
_Text = Annotated[str, Field(min_length=1, max_length=512)]
Sha256Hex = Annotated[str, Field(pattern=_HEX64)]
"""A SHA-256 digest in lower-case hex (a bearer token's, a certificate's)."""
SanUri = Annotated[str, Field(min_length=3, max_length=2048, pattern=r"^[A-Za-z][A-Za-z0-9+.-]*:")]
"""The URI SAN an MTLS principal's client certificate carries."""
_ClaimValue = str | int | bool


class PrincipalsFileError(ConfigError):
    """An unusable principals file; ``principal_id`` names the culprit when there is one."""

    def __init__(self, code: Code, problem: str, *, principal_id: str | None = None) -> None:
        where = f"principal {principal_id!r}: " if principal_id is not None else ""
        super().__init__(VARIABLE, where + problem, code=code)
        self.principal_id = principal_id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ActorModel(_Strict):
    id: _Text
    type: _Text
    runtime: _Text | None = None


class BearerCredential(_Strict):
    kind: Literal["BEARER"]
    token_sha256: Sha256Hex


class WorkloadJwtCredential(_Strict):
    kind: Literal["WORKLOAD_JWT"]
    issuer: _Text
    subject: _Text
    audience: _Text | None = None
    required_claims: dict[str, _ClaimValue] | None = None


class MtlsCredential(_Strict):
    kind: Literal["MTLS"]
    san_uri: SanUri
    cert_sha256: Sha256Hex | None = None


Credential = Annotated[
    BearerCredential | WorkloadJwtCredential | MtlsCredential, Field(discriminator="kind")
]


class ApproverRequirement(_Strict):
    """An APPROVER's ``approval``: the least verification its decisions must carry."""

    verification: Annotated[Verification, Field(strict=False)] = Verification.CREDENTIAL


class PrincipalEntry(_Strict):
    id: Annotated[str, Field(pattern=_ID)]
    role: Annotated[Role, Field(strict=False)]  # the file's text names the member
    tenant_id: Annotated[str, Field(pattern=_UUID)] | None = None
    actor: ActorModel | None = None
    allowed_actions: Annotated[list[_Text], Field(max_length=MAX_ALLOWED_ACTIONS)] | None = None
    scopes: Annotated[list[_Text], Field(max_length=MAX_SCOPES)] | None = None
    credential: Credential
    rate_limit: Annotated[str, Field(max_length=64)] | None = None
    approval: ApproverRequirement | None = None


class PrincipalsDocument(_Strict):
    """The whole ``agent-safe.principals/1`` document (also what the operator renders)."""

    version: Literal["agent-safe.principals/1"]
    principals: list[PrincipalEntry]


CredentialModel = BearerCredential | WorkloadJwtCredential | MtlsCredential


@dataclass(frozen=True)
class PrincipalRecord:
    """One principal with the credential that proves it and its own rate rule."""

    principal: Principal
    credential: CredentialModel
    rate_limit: RateRule | None = None

    @property
    def id(self) -> str:
        return self.principal.id


class PrincipalSet:
    """The door's lookup table for one loaded principals file (immutable; reload swaps it)."""

    def __init__(self, records: Iterable[PrincipalRecord]) -> None:
        self.records: tuple[PrincipalRecord, ...] = tuple(records)
        self._by_id = {r.id: r for r in self.records}
        self._bearers: tuple[tuple[bytes, PrincipalRecord], ...] = tuple(
            (bytes.fromhex(r.credential.token_sha256), r)
            for r in self.records
            if isinstance(r.credential, BearerCredential)
        )
        self._workloads = {
            (r.credential.issuer, r.credential.subject): r
            for r in self.records
            if isinstance(r.credential, WorkloadJwtCredential)
        }
        self._issuers = frozenset(issuer for issuer, _ in self._workloads)
        self._sans = {
            r.credential.san_uri: r
            for r in self.records
            if isinstance(r.credential, MtlsCredential)
        }

    def __len__(self) -> int:
        return len(self.records)

    def get(self, principal_id: str) -> PrincipalRecord | None:
        return self._by_id.get(principal_id)

    def match_bearer(self, token: str | bytes | bytearray) -> PrincipalRecord | None:
        """The bearer principal whose digest the token hashes to, compared against every one.

        Every bearer principal is compared with :func:`hmac.compare_digest` and the loop never
        exits early, so the time taken does not depend on which principal (if any) matched.
        """
        raw = token.encode("utf-8") if isinstance(token, str) else bytes(token)
        digest = hashlib.sha256(raw).digest()
        found: PrincipalRecord | None = None
        for expected, record in self._bearers:
            if hmac.compare_digest(digest, expected) and found is None:
                found = record
        return found

    @property
    def has_bearers(self) -> bool:
        return bool(self._bearers)

    @property
    def has_workloads(self) -> bool:
        return bool(self._workloads)

    @property
    def has_certificates(self) -> bool:
        return bool(self._sans)

    def knows_issuer(self, issuer: str) -> bool:
        return issuer in self._issuers

    @property
    def workload_issuers(self) -> frozenset[str]:
        """Every issuer a WORKLOAD_JWT principal names (the JWKS binds its key sets to them)."""
        return self._issuers

    def by_workload(self, issuer: str, subject: str) -> PrincipalRecord | None:
        return self._workloads.get((issuer, subject))

    def by_san_uri(self, san_uri: str) -> PrincipalRecord | None:
        return self._sans.get(san_uri)

    def bearer_principal_ids(self) -> tuple[str, ...]:
        """For ``BEARER_PRINCIPAL_CONFIGURED`` at start."""
        return tuple(r.id for _, r in self._bearers)

    def summary(self) -> list[dict[str, str]]:
        """Principals by id, role and credential kind (the status route); no credential data."""
        return [
            {"id": r.id, "role": r.principal.role.value, "credential": r.credential.kind}
            for r in self.records
        ]


def load_principals_file(
    path: str | os.PathLike[str],
    *,
    registered_actions: Iterable[str],
    jwt_configured: bool,
    client_ca_configured: bool,
    check_owner: bool = True,
) -> PrincipalSet:
    """Read, check and parse the principals file; any problem raises :class:`PrincipalsFileError`.

    ``jwt_configured`` is ``EXECUTOR_JWT_AUDIENCE`` and ``EXECUTOR_JWKS_FILE`` both set;
    ``client_ca_configured`` is ``EXECUTOR_TLS_CLIENT_CA_FILE`` set. The file is opened once and
    its mode and owner are checked on the opened descriptor, so the bytes parsed are the bytes
    checked.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        raise PrincipalsFileError(
            Code.PRINCIPALS_FILE_UNREADABLE, "the file cannot be opened"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PrincipalsFileError(
                Code.PRINCIPALS_FILE_MODE,
                "must be a regular file that neither group nor others can write",
            )
        if check_owner and info.st_uid not in (os.geteuid(), 0):
            raise PrincipalsFileError(
                Code.PRINCIPALS_FILE_OWNER, "must be owned by the executor's user or by root"
            )
        if info.st_size > MAX_FILE_BYTES:
            raise PrincipalsFileError(Code.PRINCIPALS_FILE_TOO_LARGE, "larger than 1 MiB")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise PrincipalsFileError(Code.PRINCIPALS_FILE_TOO_LARGE, "larger than 1 MiB")
    return parse_principals(
        data,
        registered_actions=registered_actions,
        jwt_configured=jwt_configured,
        client_ca_configured=client_ca_configured,
    )


def parse_principals(
    data: bytes | str | Mapping[str, Any],
    *,
    registered_actions: Iterable[str],
    jwt_configured: bool,
    client_ca_configured: bool,
) -> PrincipalSet:
    """Validate a principals document (bytes, text or parsed JSON) into a :class:`PrincipalSet`."""
    if isinstance(data, bytes | str):
        try:
            raw: Any = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise PrincipalsFileError(Code.PRINCIPALS_FILE_INVALID, "not valid JSON") from None
    else:
        raw = data
    if (
        isinstance(raw, Mapping)
        and isinstance(raw.get("principals"), list)
        and len(raw["principals"]) > MAX_PRINCIPALS
    ):
        raise PrincipalsFileError(Code.PRINCIPALS_TOO_MANY, f"at most {MAX_PRINCIPALS} principals")
    try:
        document = PrincipalsDocument.model_validate(raw)
    except ValidationError as exc:
        raise _schema_error(exc, raw) from None
    return build_principal_set(
        document,
        registered_actions=registered_actions,
        jwt_configured=jwt_configured,
        client_ca_configured=client_ca_configured,
    )


def build_principal_set(
    document: PrincipalsDocument,
    *,
    registered_actions: Iterable[str],
    jwt_configured: bool,
    client_ca_configured: bool,
) -> PrincipalSet:
    """Apply the semantic rules to a schema-valid document."""
    registered = frozenset(registered_actions)
    seen_ids: set[str] = set()
    identities: dict[tuple[str, ...], str] = {}
    records: list[PrincipalRecord] = []
    for entry in document.principals:
        if entry.id in seen_ids:
            raise PrincipalsFileError(
                Code.PRINCIPALS_DUPLICATE_ID, "the id appears twice", principal_id=entry.id
            )
        seen_ids.add(entry.id)
        identity = _credential_identity(entry.credential)
        if identity in identities:
            raise PrincipalsFileError(
                Code.PRINCIPALS_CREDENTIAL_SHARED,
                f"its credential identity is already claimed by {identities[identity]!r}",
                principal_id=entry.id,
            )
        identities[identity] = entry.id
        cred = entry.credential
        if isinstance(cred, WorkloadJwtCredential) and not jwt_configured:
            raise PrincipalsFileError(
                Code.PRINCIPALS_JWT_UNCONFIGURED,
                "a WORKLOAD_JWT credential needs EXECUTOR_JWT_AUDIENCE and EXECUTOR_JWKS_FILE",
                principal_id=entry.id,
            )
        if isinstance(cred, MtlsCredential) and not client_ca_configured:
            raise PrincipalsFileError(
                Code.PRINCIPALS_MTLS_UNCONFIGURED,
                "an MTLS credential needs EXECUTOR_TLS_CLIENT_CA_FILE",
                principal_id=entry.id,
            )
        rule: RateRule | None = None
        if entry.rate_limit is not None:
            try:
                rule = RateRule.parse(entry.rate_limit)
            except ValueError:
                raise PrincipalsFileError(
                    Code.PRINCIPALS_RATE_LIMIT_INVALID,
                    "rate_limit must be <count>/<seconds> with positive integers",
                    principal_id=entry.id,
                ) from None
        records.append(
            PrincipalRecord(
                principal=_principal(entry, registered), credential=cred, rate_limit=rule
            )
        )
    _check_collisions(records)
    _check_separation(records)
    return PrincipalSet(records)


def _principal(entry: PrincipalEntry, registered: frozenset[str]) -> Principal:
    pid = entry.id

    def refuse(problem: str) -> PrincipalsFileError:
        return PrincipalsFileError(Code.PRINCIPALS_ROLE_INVALID, problem, principal_id=pid)

    actor = (
        Actor(id=entry.actor.id, type=entry.actor.type, runtime=entry.actor.runtime)
        if entry.actor is not None
        else None
    )
    kind = entry.credential.kind
    if entry.approval is not None and entry.role is not Role.APPROVER:
        raise refuse("only an APPROVER carries approval")
    if entry.role is Role.PROPOSER:
        if entry.tenant_id is None or actor is None or entry.allowed_actions is None:
            raise refuse("a PROPOSER needs tenant_id, actor and allowed_actions")
        if entry.scopes is not None:
            raise refuse("a PROPOSER carries no scopes")
        if not entry.allowed_actions:
            raise refuse("allowed_actions is empty")
        unknown = [a for a in entry.allowed_actions if a not in registered]
        if unknown:
            raise PrincipalsFileError(
                Code.PRINCIPALS_ACTION_UNKNOWN,
                f"allowed_actions names {len(unknown)} action(s) no handler registered",
                principal_id=pid,
            )
        return Principal(
            id=pid,
            role=Role.PROPOSER,
            tenant_id=entry.tenant_id.lower(),
            actor=actor,
            allowed_actions=frozenset(entry.allowed_actions),
            credential_kind=kind,
        )
    if entry.role is Role.OPERATOR:
        if entry.tenant_id is not None or entry.allowed_actions is not None:
            raise refuse("an OPERATOR carries no tenant_id or allowed_actions")
        if not entry.scopes:
            raise refuse("an OPERATOR needs at least one scope")
        if not set(entry.scopes) <= frozenset(Scope):
            raise refuse("scopes must be drawn from " + ", ".join(sorted(Scope)))
        return Principal(
            id=pid,
            role=Role.OPERATOR,
            actor=actor,
            scopes=frozenset(Scope(scope) for scope in entry.scopes),
            credential_kind=kind,
        )
    # APPROVER: a person who may approve escalations; ``actor`` names the person.
    if actor is None:
        raise refuse("an APPROVER needs an actor naming the person")
    if entry.tenant_id is not None or entry.allowed_actions is not None or entry.scopes:
        raise refuse("an APPROVER carries no tenant_id, allowed_actions or scopes")
    verification = entry.approval.verification if entry.approval else Verification.CREDENTIAL
    return Principal(
        id=pid,
        role=Role.APPROVER,
        actor=actor,
        credential_kind=kind,
        verification=verification,
    )


def _names(principal: Principal) -> tuple[str, ...]:
    return (principal.id,) if principal.actor is None else (principal.id, principal.actor.id)


def _check_collisions(records: list[PrincipalRecord]) -> None:
    """Refuse two principals whose ids or actor ids are one name under :func:`actor_key` but
    spelled differently: which spelling a comparison meets would decide who is whom."""
    seen: dict[str, dict[str, str]] = {}  # key -> {spelling: the first principal using it}
    for record in records:
        for name in _names(record.principal):
            spellings = seen.setdefault(actor_key(name), {})
            others = {owner for spelling, owner in spellings.items() if owner != record.id}
            if others and spellings.get(name, record.id) == record.id:
                raise PrincipalsFileError(
                    Code.PRINCIPALS_ACTOR_COLLISION,
                    "its id or actor id spells the same actor as principal "
                    f"{min(others)!r} differently (case or compatibility form)",
                    principal_id=record.id,
                )
            spellings.setdefault(name, record.id)


def _check_separation(records: list[PrincipalRecord]) -> None:
    """Refuse the obvious self-approval shapes: proposer as approver, proposer actor as operator
    (names compared under :func:`actor_key`)."""
    approver_names: set[str] = set()
    operator_actors: set[str] = set()
    for record in records:
        p = record.principal
        if p.role is Role.APPROVER:
            approver_names.update(actor_key(name) for name in _names(p))
        elif p.role is Role.OPERATOR and p.actor is not None:
            operator_actors.add(actor_key(p.actor.id))
    for record in records:
        p = record.principal
        if p.role is not Role.PROPOSER:
            continue
        actor_id = actor_key(p.actor.id) if p.actor is not None else None
        if (
            actor_key(p.id) in approver_names
            or (actor_id is not None and actor_id in approver_names)
            or (actor_id is not None and actor_id in operator_actors)
        ):
            raise PrincipalsFileError(
                Code.SEPARATION_OF_DUTIES_VIOLATED,
                "a proposer may not share its id or actor with an approver, "
                "nor its actor with an operator",
                principal_id=p.id,
            )


def _credential_identity(credential: CredentialModel) -> tuple[str, ...]:
    if isinstance(credential, BearerCredential):
        return ("BEARER", credential.token_sha256)
    if isinstance(credential, WorkloadJwtCredential):
        return ("WORKLOAD_JWT", credential.issuer, credential.subject)
    return ("MTLS", credential.san_uri)


def _schema_error(exc: ValidationError, raw: Any) -> PrincipalsFileError:
    """Describe the first schema problem by location and kind, never by the offending value."""
    first = exc.errors(include_input=False, include_url=False)[0]
    loc = tuple(first.get("loc", ()))
    principal_id: str | None = None
    if len(loc) >= 2 and loc[0] == "principals" and isinstance(loc[1], int):
        entries = raw.get("principals") if isinstance(raw, Mapping) else None
        candidate = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
        cid = candidate.get("id") if isinstance(candidate, Mapping) else None
        if isinstance(cid, str) and len(cid) <= 128 and cid.isprintable():
            principal_id = cid
        else:
            principal_id = f"#{loc[1]}"
        loc = loc[2:]
    where = ".".join(str(part) for part in loc if not isinstance(part, int)) or "document"
    # pydantic adds the union member's tag to locations; keep only field names.
    problem = f"{where}: {first.get('type', 'invalid')}"
    return PrincipalsFileError(Code.PRINCIPALS_FILE_INVALID, problem, principal_id=principal_id)


def render_principals_file(document: PrincipalsDocument) -> str:
    """The document as the executor reads it (stable key order, no unset optional fields)."""
    payload = document.model_dump(mode="json", exclude_none=True)
    return json.dumps(payload, indent=2, sort_keys=False) + "\n"
