"""The policy authority: ALLOW / BLOCK / ESCALATE for a captured intent, and single-use grants.

:class:`Authority` is the contract the pipeline speaks to (a remote authority can implement it
later); :class:`LocalAuthority` is the built-in one, evaluating the compiled policy document of
``EXECUTOR_POLICY_FILE`` in process:

1. the intent's action must be in the policy (else ``BLOCK POLICY_ACTION_UNKNOWN``);
2. its parameters must satisfy the action's JSON Schema (else ``BLOCK PARAMETERS_INVALID``; the
   answer says nothing about which value failed);
3. the rules are tried in order, the first whose CEL ``when`` is true decides (none:
   ``BLOCK POLICY_NO_MATCH``; an expression that fails or yields a non-boolean:
   ``BLOCK POLICY_EVALUATION_ERROR`` -- fail closed);
4. an ``ESCALATE`` names the rule's approvers. Evaluated again with ``approval=`` evidence, an
   approval by one of those approvers for this exact intent hash becomes ``ALLOW``
   (``APPROVED_BY_APPROVER``), a denial ``BLOCK APPROVAL_DENIED``, an approval whose
   ``verification`` is below the rule's ``approval.verification``
   ``BLOCK APPROVAL_VERIFICATION_REQUIRED``, anything else ``BLOCK APPROVAL_BINDING_MISMATCH``;
5. an ``ALLOW`` carries a grant: a compact EdDSA JWS (``typ: agentsafe-grant+jwt``) bound to the
   intent hash and the digest of the exact parameters, valid at most :data:`GRANT_TTL_SECONDS`
   and never past the intent's expiry. The grant never leaves the process.

:meth:`LocalAuthority.claim` verifies a grant against the presented intent and consumes it once,
atomically, in the use store (a grant it signed itself in this process, presented as it was
issued, is not verified again: see ``_grant_payload``); with a shared store the claim is fenced
by the attempt's current owner, epoch and lease (the attempt hands it its
:class:`~agentsafe.executor.state.records.AttemptFence`), in the same statement.
:meth:`LocalAuthority.finalize` records how the attempt ended with the effect record the handler
registered and the provider's effect receipt verbatim: the receipt is verified against the
provider keys registered with this authority (the policy's ``providerKeys``), reported whether
or not it verifies, and read as ``SIGNED_RECEIPT`` effect evidence when it states the expected
effect (:class:`Finalization`'s ``effect_report``); a receipt is never a reason to refuse a
finalization. :meth:`LocalAuthority.sign_token` / :meth:`verify_token` sign the executor's other
hand-outs (escalation objects, recovery references) under the same key.

The protocol, its records and :class:`GrantRefused` are defined in ``policy/records.py`` and
re-exported here: importers name this module.

Callers: ``lifecycle/pipeline.py`` (evaluate; escalation and recovery tokens),
``lifecycle/attempt.py`` (claim, finalize, recovery tokens), ``assembly.py`` (construction),
``plane.py`` (the key set of the JWKS route).
Also imported by ``trial.py``.
Also imported by ``lifecycle/escalations.py``, ``lifecycle/reconciliations.py``.
Also imported by ``lifecycle/approval_requests.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .. import telemetry
from ..canonical import sha256_bytes_digest, sha256_digest
from ..clock import Clock
from ..codes import Code
from ..grants import KeySet, SigningKey, TokenRefused, own_payload, sign_jws, verify_jws
from ..ids import uuid4_text
from ..intent import UUID4, CapturedIntent
from ..principals import Principal, Verification, same_actor
from ..schema import fast_valid
from .attestation import claim_token_digest, issue_claim_attestation
from .celexpr import VARIABLES, Activation, EvaluationError
from .policy import CompiledAction, CompiledPolicy, CompiledRule, Verdict
from .records import (
    Authority,
    Claim,
    Decision,
    EffectEvidence,
    Evaluation,
    Finalization,
    Finalizer,
    GrantRefused,
    ReceiptVerification,
    ReceiptVerifier,
    RuleTrial,
    Stage,
)

if TYPE_CHECKING:
    from ..state.protocol import UseStore
    from ..state.records import AttemptFence

log = logging.getLogger(__name__)

__all__ = [
    "ESCALATION_TYP",
    "GRANT_TTL_SECONDS",
    "GRANT_TYP",
    "PAYLOAD_CANONICALIZATION_PROFILE",
    "RECOVERY_TYP",
    "Authority",
    "Claim",
    "Decision",
    "EffectEvidence",
    "Evaluation",
    "Finalization",
    "GrantRefused",
    "LocalAuthority",
    "ReceiptVerification",
    "ReceiptVerifier",
    "RuleTrial",
    "Stage",
    "Verdict",
    "evaluate_policy",
]

GRANT_TYP = "agentsafe-grant+jwt"
ESCALATION_TYP = "agentsafe-escalation+jwt"
RECOVERY_TYP = "agentsafe-recovery+jwt"
PAYLOAD_CANONICALIZATION_PROFILE = "RFC8785/JCS"
GRANT_TTL_SECONDS = 60.0
"""The longest a grant lives; it is also cut to the intent's expiry."""

_TOKEN_TYP = re.compile(r"^agentsafe-[a-z][a-z0-9-]*\+jwt$")
_BINDING_KEYS = frozenset(
    {"intent_hash", "execution_payload_digest", "execution_payload_canonicalization_profile"}
)

ISSUED_GRANTS_KEPT = 1024
"""How many issued grants not yet presented :class:`LocalAuthority` remembers. A claim follows its
decision within one request, so this bounds only grants that are never claimed (shadow mode, an
attempt refused before its claim); a grant evicted from the record is verified as any other."""

# Reason codes a rule without ``reasonCode`` reports.
_DEFAULT_REASON = {
    Verdict.ALLOW: Code.POLICY_ALLOWED,
    Verdict.BLOCK: Code.POLICY_BLOCKED,
    Verdict.ESCALATE: Code.APPROVAL_REQUIRED,
}


class LocalAuthority:
    """The built-in authority: the compiled policy, an Ed25519 key and the use store."""

    def __init__(
        self,
        policy: CompiledPolicy,
        *,
        keys: SigningKey,
        store: UseStore,
        clock: Clock,
        retired_keys: tuple[SigningKey, ...] = (),
        grant_ttl_seconds: float = GRANT_TTL_SECONDS,
        finalizer: Finalizer | None = None,
        receipts: ReceiptVerifier | None = None,
    ) -> None:
        if not 0 < grant_ttl_seconds <= GRANT_TTL_SECONDS:
            raise ValueError(f"grant_ttl_seconds must be in (0, {GRANT_TTL_SECONDS}]")
        self._policy = policy
        self._key = keys
        self._retired: tuple[SigningKey, ...] = tuple(retired_keys)
        self._key_set = KeySet((keys, *retired_keys))
        self._store = store
        self._clock = clock
        self._grant_ttl = grant_ttl_seconds
        self._finalizer = finalizer
        self._receipts = receipts
        self._issued: dict[str, str] = {}
        """The grants this authority signed and nobody has presented yet: the exact token and
        the ``kid`` it was signed under, the oldest first, at most :data:`ISSUED_GRANTS_KEPT`
        (see :meth:`_grant_payload`)."""
        self._issued_lock = threading.Lock()

    @property
    def policy(self) -> CompiledPolicy:
        return self._policy

    @property
    def key_set(self) -> KeySet:
        return self._key_set

    def rotate_key(self, key: SigningKey, *, keep_retired: int = 2) -> None:
        """Sign with ``key`` from now on; the previous keys keep verifying (and stay in the
        published JWKS) so grants, attestations and hand-outs already issued remain valid."""
        if key.kid == self._key.kid:
            return
        retired = [k for k in self._retired if k.kid != key.kid]
        self._retired = (self._key, *retired)[:keep_retired]
        self._key = key
        self._key_set = KeySet((key, *self._retired))

    def jwks(self) -> dict[str, Any]:
        """The public keys, for ``GET /.well-known/agentsafe-grant-jwks.json``."""
        return self._key_set.jwks()

    # -- evaluate ------------------------------------------------------------------------------

    async def evaluate(
        self,
        intent: CapturedIntent,
        *,
        principal: Principal,
        approval: Mapping[str, Any] | None = None,
    ) -> Decision:
        with telemetry.span("agentsafe.decision", {"agentsafe.action": intent.action}) as current:
            decision = self.decide(intent, principal=principal, approval=approval)
            if current is not None:
                attributes: dict[str, object] = {"agentsafe.verdict": decision.verdict.value}
                if decision.reason_codes:
                    attributes["agentsafe.code"] = str(decision.reason_codes[0])
                current.set_attributes(telemetry.safe_attributes(attributes))
            return decision

    def decide(
        self,
        intent: CapturedIntent,
        *,
        principal: Principal,
        approval: Mapping[str, Any] | None = None,
    ) -> Decision:
        """:meth:`evaluate` without the coroutine: pure CPU, no I/O."""
        now = self._clock.now()
        result = evaluate_policy(
            self._policy, intent, principal=principal, approval=approval, now=now
        )
        if result.verdict is Verdict.ALLOW and result.rule is not None:
            return self._allow(intent, result.reason_codes, rule=result.rule, now=now)
        return self._answer(
            result.verdict,
            result.reason_codes,
            rule=result.rule,
            approvers=result.approvers,
            verification=result.verification,
            now=now,
        )

    def _allow(
        self, intent: CapturedIntent, reasons: tuple[str, ...], *, rule: str, now: float
    ) -> Decision:
        decision_id = uuid4_text()
        dossier_id = uuid4_text()
        grant_id = uuid4_text()
        issued = _floor_ms(now)
        expires = _floor_ms(min(now + self._grant_ttl, intent.expires_at))
        if expires <= now:
            return self._answer(Verdict.BLOCK, (Code.INTENT_EXPIRED,), rule=rule, now=now)
        payload = {
            "sub": grant_id,
            "decision_id": decision_id,
            "dossier_id": dossier_id,
            "iat": issued,
            "nbf": issued,
            "exp": expires,
            "binding": {
                "intent_hash": intent.intent_hash,
                "execution_payload_digest": intent.payload_digest,
                "execution_payload_canonicalization_profile": PAYLOAD_CANONICALIZATION_PROFILE,
            },
        }
        grant = sign_jws(payload, typ=GRANT_TYP, key=self._key)
        with self._issued_lock:
            if len(self._issued) >= ISSUED_GRANTS_KEPT:
                del self._issued[next(iter(self._issued))]
            self._issued[grant] = self._key.kid
        return Decision(
            verdict=Verdict.ALLOW,
            decision_id=decision_id,
            dossier_id=dossier_id,
            reason_codes=reasons,
            rule=rule,
            approvers=(),
            grant=grant,
            grant_id=grant_id,
            grant_expires_at=expires,
            authority_time=now,
        )

    @staticmethod
    def _answer(
        verdict: Verdict,
        reasons: tuple[str, ...],
        *,
        now: float,
        rule: str | None = None,
        approvers: tuple[str, ...] = (),
        verification: Verification = Verification.CREDENTIAL,
    ) -> Decision:
        return Decision(
            verdict=verdict,
            decision_id=uuid4_text(),
            dossier_id=uuid4_text(),
            reason_codes=reasons,
            rule=rule,
            approvers=approvers,
            grant=None,
            grant_id=None,
            grant_expires_at=None,
            authority_time=now,
            verification=verification,
        )

    # -- claim ---------------------------------------------------------------------------------

    async def claim(
        self, grant: str, *, intent: CapturedIntent, fence: AttemptFence | None = None
    ) -> Claim:
        with telemetry.span("agentsafe.claim") as current:
            try:
                claim = await self._claim(grant, intent=intent, fence=fence)
            except GrantRefused as exc:
                if current is not None:
                    attributes = {"agentsafe.code": str(exc.code), "agentsafe.outcome": "REFUSED"}
                    current.set_attributes(telemetry.safe_attributes(attributes))
                raise
            if current is not None:
                current.set_attribute("agentsafe.outcome", "CLAIMED")
            return claim

    async def _claim(
        self, grant: str, *, intent: CapturedIntent, fence: AttemptFence | None
    ) -> Claim:
        try:
            payload = self._grant_payload(grant)
        except TokenRefused as exc:
            code = (
                Code.GRANT_MALFORMED
                if exc.code == Code.JWS_MALFORMED
                else Code.GRANT_SIGNATURE_INVALID
            )
            raise GrantRefused(code, "the grant does not verify") from None
        fields = _grant_fields(payload)
        binding = fields.binding
        now = self._clock.now()
        if now < fields.not_before or now >= fields.expires_at:
            raise GrantRefused(Code.GRANT_EXPIRED, "the grant is not valid now")
        if (
            binding["intent_hash"] != intent.intent_hash
            or binding["execution_payload_digest"] != intent.payload_digest
            or binding["execution_payload_canonicalization_profile"]
            != PAYLOAD_CANONICALIZATION_PROFILE
        ):
            raise GrantRefused(Code.GRANT_BINDING_MISMATCH, "the grant is bound to another intent")
        if fence is None:
            claimed = await self._store.claim_grant(
                fields.grant_id,
                binding_digest=sha256_digest(binding),
                expires_at=fields.expires_at,
                now=now,
            )
        else:  # fenced by the attempt's owner, epoch and lease, in the claim's own statement
            claimed = await self._store.claim_grant(
                fields.grant_id,
                binding_digest=sha256_digest(binding),
                expires_at=fields.expires_at,
                now=now,
                fence=fence,
                payload_digest=binding["execution_payload_digest"],
            )
        if not claimed:
            raise GrantRefused(Code.GRANT_ALREADY_CLAIMED, "the grant was already claimed")
        token_digest = claim_token_digest(grant)
        claim = Claim(
            grant_id=fields.grant_id,
            decision_id=fields.decision_id,
            dossier_id=fields.dossier_id,
            expires_at=fields.expires_at,
            intent_hash=binding["intent_hash"],
            execution_payload_digest=binding["execution_payload_digest"],
            claim_token_digest=token_digest,
        )
        attestation = issue_claim_attestation(
            claim, claim_token_digest=token_digest, key=self._key, now=now
        )
        return dataclasses.replace(claim, attestation=attestation)

    def _grant_payload(self, grant: str) -> dict[str, Any]:
        """The payload of a presented grant, its signature verified (raises
        :class:`TokenRefused`), unless it is a grant this authority signed itself.

        A grant never leaves the process: the one the attempt presents is, byte for byte, the
        token :meth:`_allow` signed moments before. For such a token (it is looked up, and
        forgotten, by its exact text) whose key is still in the key set, every check of
        ``verify_jws`` holds by construction, so its payload is read without verifying the
        Ed25519 signature again (issue 34: most of the cost of a claim's verification, about
        0.2 ms of an ALLOW). Any other token (one evicted from the record, presented a second
        time, altered by a byte, or signed under a key rotated out since) is verified as
        before."""
        with self._issued_lock:
            kid = self._issued.pop(grant, None)
        if kid is not None and self._key_set.get(kid) is not None:
            return own_payload(grant)
        return verify_jws(grant, typ=GRANT_TYP, keys=self._key_set)

    # -- finalize ------------------------------------------------------------------------------

    async def finalize(
        self,
        claim: Claim,
        *,
        outcome: str,
        executed: bool | None,
        effect: Mapping[str, Any] | None = None,
        effect_receipt: str | None = None,
    ) -> Finalization:
        """Record the end of ``claim`` with its effect evidence (see :class:`Finalization`).

        The receipt is verified against the registered provider keys and reported whether or
        not it verifies; a verified one that states the effect the record was authorised for
        (its ``authorised_effect_digest``, derived from the parameters the grant binds) is the
        effect's evidence as ``SIGNED_RECEIPT``, else the record is (``OBSERVATION``). Nothing
        in a receipt, however malformed, makes this fail."""
        with telemetry.span("agentsafe.finalize", {"agentsafe.outcome": outcome}):
            return await self._finalize(
                claim, outcome=outcome, executed=executed, effect=effect, receipt=effect_receipt
            )

    async def _finalize(
        self,
        claim: Claim,
        *,
        outcome: str,
        executed: bool | None,
        effect: Mapping[str, Any] | None,
        receipt: str | None,
    ) -> Finalization:
        effect_receipt = receipt
        finalization = Finalization(
            status="RECORDED",
            outcome=outcome,
            executed=executed,
            effect=dict(effect) if effect is not None else None,
            effect_receipt=effect_receipt,
            effect_report=self._effect_report(claim, effect, effect_receipt),
        )
        if self._finalizer is not None:
            await self._finalizer(claim, finalization)
        return finalization

    def _effect_report(
        self, claim: Claim, effect: Mapping[str, Any] | None, receipt: str | None
    ) -> dict[str, Any]:
        record_digest = effect.get("record_digest") if effect is not None else None
        report: dict[str, Any] = {
            "effect_evidence": (
                EffectEvidence.OBSERVATION if effect is not None else EffectEvidence.NONE
            ).value,
            "record_digest": record_digest if isinstance(record_digest, str) else None,
            "receipt": ReceiptVerification.ABSENT.value,
            "receipt_digest": None,
            "receipt_reason": None,
        }
        if receipt is None:
            return report
        report["receipt"] = ReceiptVerification.UNVERIFIED.value
        report["receipt_digest"] = sha256_bytes_digest(receipt)
        if self._receipts is None:
            report["receipt_reason"] = Code.EFFECT_RECEIPT_INVALID.value  # no keys registered
            return report
        try:
            checked = self._receipts.check(
                receipt, grant_id=claim.grant_id, claim_token_digest=claim.claim_token_digest
            )
        except Exception:  # a receipt is never a reason to refuse a finalization
            log.exception("the effect receipt could not be read")
            report["receipt_reason"] = Code.EFFECT_RECEIPT_INVALID.value
            return report
        report["receipt_digest"] = checked.digest
        if not checked.verified:
            report["receipt_reason"] = checked.reason or Code.EFFECT_RECEIPT_INVALID.value
            return report
        report["receipt"] = ReceiptVerification.VERIFIED.value
        expected = effect.get("authorised_effect_digest") if effect is not None else None
        if checked.effect_digest is not None and checked.effect_digest == expected:
            report["effect_evidence"] = EffectEvidence.SIGNED_RECEIPT.value
        return report

    # -- other signed tokens -------------------------------------------------------------------

    def sign_token(self, payload: Mapping[str, Any], *, typ: str) -> str:
        """Sign an executor hand-out (``ESCALATION_TYP``, ``RECOVERY_TYP``, ...); never a grant.

        Put what the token is bound to (the intent hash, a request id, an expiry) in ``payload``
        and compare it on the way back in: the signature makes it unforgeable, the comparison
        keeps it from being re-bound.
        """
        _check_token_typ(typ)
        return sign_jws(payload, typ=typ, key=self._key)

    def verify_token(self, token: str, *, typ: str) -> dict[str, Any]:
        """Verify a token from :meth:`sign_token`; raises ``grants.TokenRefused``."""
        _check_token_typ(typ)
        return verify_jws(token, typ=typ, keys=self._key_set)


def _check_token_typ(typ: str) -> None:
    if typ == GRANT_TYP or not _TOKEN_TYP.match(typ):
        raise ValueError("not a token type this authority signs on request")


@dataclass(frozen=True)
class _GrantFields:
    grant_id: str
    decision_id: str
    dossier_id: str
    not_before: float
    expires_at: float
    binding: dict[str, str]


def _grant_fields(payload: Mapping[str, Any]) -> _GrantFields:
    """The grant's payload checked for shape; anything else is ``GRANT_MALFORMED``."""
    ids = [payload.get(name) for name in ("sub", "decision_id", "dossier_id")]
    times = [payload.get(name) for name in ("iat", "nbf", "exp")]
    binding = payload.get("binding")
    id_values = [value for value in ids if isinstance(value, str) and UUID4.fullmatch(value)]
    time_values = [
        float(value)
        for value in times
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    if (
        len(id_values) != 3
        or len(time_values) != 3
        or not isinstance(binding, dict)
        or set(binding) != _BINDING_KEYS
        or not all(isinstance(value, str) for value in binding.values())
    ):
        raise GrantRefused(Code.GRANT_MALFORMED, "the grant's payload is not a grant")
    return _GrantFields(
        grant_id=id_values[0],
        decision_id=id_values[1],
        dossier_id=id_values[2],
        not_before=time_values[1],
        expires_at=time_values[2],
        binding=binding,
    )


def evaluate_policy(
    policy: CompiledPolicy,
    intent: CapturedIntent,
    *,
    principal: Principal,
    now: float,
    approval: Mapping[str, Any] | None = None,
) -> Evaluation:
    """Steps 1-4 of the module docstring: pure, no key and no I/O.

    :meth:`LocalAuthority.decide` signs a grant on the ``ALLOW`` this returns; ``agentsafe policy
    test`` and ``explain`` (``policy/trial.py``) call it directly, so a policy test exercises
    exactly the code that decides in ``serve``.
    """
    if now >= intent.expires_at:
        return Evaluation(Verdict.BLOCK, (Code.INTENT_EXPIRED,), None, (), Stage.EXPIRY)
    action = policy.actions.get(intent.action)
    if action is None:
        return Evaluation(Verdict.BLOCK, (Code.POLICY_ACTION_UNKNOWN,), None, (), Stage.ACTION)
    checked = _check_parameters(action, intent.parameters)
    if checked is not None:
        return Evaluation(Verdict.BLOCK, (checked,), None, (), Stage.PARAMETERS)
    activation = Activation(_variables(intent, action.variables, principal=principal, now=now))
    trials: list[RuleTrial] = []
    matched: CompiledRule | None = None
    for rule in action.rules:
        try:
            hit = rule.expression.evaluate(activation)
        except EvaluationError:
            trials.append(RuleTrial(rule.name, rule.path, rule.expression.source, None))
            return Evaluation(
                Verdict.BLOCK,
                (Code.POLICY_EVALUATION_ERROR,),
                rule.name,
                (),
                Stage.RULES,
                tuple(trials),
            )
        trials.append(RuleTrial(rule.name, rule.path, rule.expression.source, hit))
        if hit:
            matched = rule
            break
    tried = tuple(trials)
    if matched is None:
        return Evaluation(Verdict.BLOCK, (Code.POLICY_NO_MATCH,), None, (), Stage.NO_MATCH, tried)
    reasons = (matched.reason_code or _DEFAULT_REASON[matched.verdict],)
    if matched.verdict is not Verdict.ESCALATE:
        return Evaluation(matched.verdict, reasons, matched.name, (), Stage.RULES, tried)
    if approval is None:
        return Evaluation(
            Verdict.ESCALATE,
            reasons,
            matched.name,
            matched.approvers,
            Stage.RULES,
            tried,
            verification=matched.verification,
        )
    verdict, reason = _resolve_approval(intent, principal, matched, approval)
    return Evaluation(verdict, (reason,), matched.name, (), Stage.APPROVAL, tried)


def _resolve_approval(
    intent: CapturedIntent,
    principal: Principal,
    rule: CompiledRule,
    approval: Mapping[str, Any],
) -> tuple[Verdict, str]:
    decision = approval.get("decision")
    approver = approval.get("approver")
    approver_actor = approval.get("approver_actor")
    request_id = approval.get("request_id")
    if (
        decision not in ("APPROVE", "DENY")
        or not isinstance(approver, str)
        or approver not in rule.approvers
        or not isinstance(request_id, str)
        or not request_id
        or approval.get("intent_hash") != intent.intent_hash
    ):
        return Verdict.BLOCK, Code.APPROVAL_BINDING_MISMATCH
    proposer_actor = (intent.binding.get("actor") or {}).get("id")
    # Separation of duties under the one comparison of actor names (principals.same_actor).
    if same_actor(approver, principal.id) or (
        isinstance(approver_actor, str)
        and same_actor(approver_actor, (proposer_actor, _actor_id(principal)))
    ):
        return Verdict.BLOCK, Code.SEPARATION_OF_DUTIES_VIOLATED
    if decision == "DENY":
        return Verdict.BLOCK, Code.APPROVAL_DENIED
    try:
        verified = Verification(approval.get("verification", Verification.CREDENTIAL))
    except ValueError:
        return Verdict.BLOCK, Code.APPROVAL_BINDING_MISMATCH
    if not verified.meets(rule.verification):
        return Verdict.BLOCK, Code.APPROVAL_VERIFICATION_REQUIRED
    return Verdict.ALLOW, Code.APPROVED_BY_APPROVER


def _check_parameters(action: CompiledAction, parameters: Mapping[str, Any]) -> str | None:
    """None when the parameters satisfy the schema, else the reason code to BLOCK with.

    The compiled validator (``action.fast_validator``, where the policy could build one) is
    asked first and only its "valid" is taken: a "not valid" or an error of its own is decided
    by the reference validator (``action.validator``), so every BLOCK here is the reference's."""
    fast = action.fast_validator
    if fast_valid(fast, parameters):
        return None
    try:
        valid = action.validator.is_valid(parameters)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException:
        # An unresolvable $ref, a recursion with no end, a validator bug, or a Rust panic in
        # the reference resolver under it (``rpds``, a ``BaseException``): refuse, never allow.
        return Code.POLICY_EVALUATION_ERROR
    return None if valid else Code.PARAMETERS_INVALID


def _variables(
    intent: CapturedIntent, names: frozenset[str], *, principal: Principal, now: float
) -> dict[str, Any]:
    """The activation's variables among ``names`` (those the action's rules refer to): each is
    built and converted for CEL only when a rule can read it (:data:`_MAKERS`, built once)."""
    return {name: _MAKERS[name](intent, principal, now) for name in VARIABLES & names}


def _action_view(intent: CapturedIntent, principal: Principal, now: float) -> dict[str, Any]:
    action = intent.binding.get("action") or {}
    return {"type": action.get("type"), "resource": action.get("resource")}


_MAKERS: dict[str, Callable[[CapturedIntent, Principal, float], Any]] = {
    "action": _action_view,
    "target": lambda intent, principal, now: dict(intent.binding.get("downstream_target") or {}),
    "params": lambda intent, principal, now: intent.parameters,
    "principal": lambda intent, principal, now: principal.view(),
    "tenant": lambda intent, principal, now: intent.tenant_id,
    "context": lambda intent, principal, now: dict(intent.binding.get("context") or {}),
    "now": lambda intent, principal, now: datetime.fromtimestamp(now, tz=UTC),
}
"""How each CEL variable is built from the intent, the principal and the authority's clock."""


def _actor_id(principal: Principal) -> str | None:
    return principal.actor.id if principal.actor else None


def _floor_ms(seconds: float) -> float:
    return math.floor(seconds * 1000) / 1000
