"""Admission review of an AgentPolicy: refuse before it is stored what the reconcile would refuse.

Kubernetes' own CEL (a ValidatingAdmissionPolicy) cannot compile agentsafe's rule language
(the ``when`` variables, the function list and the parameter schemas are the executor's), so the
operator serves a validating admission webhook (kopf's ``@kopf.on.validate``, registered by
``handlers.build_registry`` and served by kopf's webhook server, see ``webhook_tls.py``).
:func:`review_policy` is what it decides, with nothing written twice:

- the stored shape: ``spec`` through :class:`~.models.AgentPolicySpec`
  (:func:`~.runtime.parse_spec`, the reconcile's own reader): reason ``SpecInvalid``; the
  downstream URLs there go through the executor's one URL validation
  (``config.check_downstream_url``, which its configuration loader uses too), so a URL the
  executor would refuse (``ftp:``, port 99999, ``user:password@``) is refused here, before it
  is stored;
- the policy: :func:`~.render.compile_spec_policy` (the executor's ``compile_policy``: every
  parameter schema checked, every CEL ``when`` compiled by the policy authority's compiler):
  reason ``PolicyInvalid``, with the path of the rule and what is wrong
  (``actions[0].rules[1].when: the expression does not compile ...``), never the compiler's
  own text, which quotes the expression or the pattern.

An admitted spec may still come back with warnings (the API server hands them to the client:
``kubectl apply`` prints ``Warning: ...``): those of
:func:`~.render.workload.worker_warnings`, a CPU or memory limit the workers would not fit in,
counted with the operator's own default when ``spec.workers`` is unset. The reconcile reports
the same words in its ``Reconciled`` message and a Warning Event.

A refusal (:class:`AdmissionRefused`) carries exactly the reason and message the
``Reconciled``/``Ready`` conditions would report for the same spec, so the webhook and the
condition never disagree; the messages name paths and compiler errors, never a value of the
object (pydantic's ``include_input=False``) and never a Secret (a spec names Secrets, it holds
none). ``spec.tests`` are not run here: a failing case is reported afterwards
(``PolicyTestsFailed``), as before, so an author can store a policy and its failing test while
fixing one of them.

Only a change of ``spec`` is reviewed: an UPDATE that leaves ``spec`` as it was (finalizers,
labels, kopf's annotations) and anything on an object being deleted is admitted, so an object
stored before the webhook existed can always be deleted and its finalizer removed. The chart's
``matchConditions`` send the API server's request only for spec changes in the first place.

Callers: ``handlers.py`` (the kopf boundary maps :class:`AdmissionRefused` to
``kopf.AdmissionError``), the tests.
Also imported by ``cli.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .errors import OperatorError
from .models import AgentPolicySpec, ConditionReason
from .render import RenderError, compile_spec_policy
from .render.workload import worker_warnings
from .runtime import InvalidSpec, parse_spec
from .settings import OperatorSettings

__all__ = ["ADMISSION_WEBHOOK_ID", "AdmissionRefused", "review_policy"]

ADMISSION_WEBHOOK_ID: Final = "agentpolicies.agentsafe.io"
"""The validate handler's id: kopf's webhook server routes ``POST /<id>`` to it, so the
ValidatingWebhookConfiguration's ``service.path`` (the chart's ``webhook.yaml``) is ``/`` + this.
Also the webhook's ``name`` there."""

REVIEWED_OPERATIONS: Final = frozenset({"CREATE", "UPDATE"})


class AdmissionRefused(OperatorError):
    """The AgentPolicy is refused; ``reason`` is the condition reason it would get."""

    def __init__(self, reason: ConditionReason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def _spec_of(body: Mapping[str, Any] | None) -> Any:
    return None if body is None else body.get("spec")


def review_policy(
    operation: str | None,
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
    *,
    settings: OperatorSettings | None = None,
) -> list[str]:
    """Admit one AgentPolicy admission request, with the warnings for its author (the workers'
    resources, with ``settings``' defaults), or refuse it (:class:`AdmissionRefused`)."""
    if operation not in REVIEWED_OPERATIONS:
        return []
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return []
    if operation == "UPDATE" and old is not None and _spec_of(old) == _spec_of(body):
        return []
    try:
        spec = parse_spec(AgentPolicySpec, body)
    except InvalidSpec as exc:
        raise AdmissionRefused(ConditionReason.SPEC_INVALID, str(exc)) from None
    try:
        compile_spec_policy(spec.policy)
    except RenderError as exc:
        raise AdmissionRefused(exc.reason, exc.message) from None
    return worker_warnings(spec, settings or OperatorSettings())
