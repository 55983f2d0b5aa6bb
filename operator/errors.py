"""The operator's exception hierarchy: one root for every error the operator raises on purpose.

Every exception class defined in ``operator/`` derives from :class:`OperatorError`, so the kopf
boundary (``handlers.py``) and the command line (``cli.py``) can tell the operator's own refusals
from a library's failure (``tests/operator/test_errors.py`` keeps this tree equal to the
classes). The operator's errors carry no stable code: a refusal reaches the AgentPolicy's Ready
condition as a ``ConditionReason`` (``reason``), and a message never holds a credential.

    OperatorError               root
    ├── InvalidSpec             a stored object does not validate against its model (runtime.py)
    ├── RenderError             nothing can be rendered; ``reason`` is the condition reason
    │                           (render/common.py)
    ├── AdmissionRefused        the admission webhook refuses an AgentPolicy (admission.py)
    ├── ApiError                the API server refused a call or answered what is not JSON
    │                           (kubeapi.py)
    ├── LoginFailed             the operator's credentials did not load (kubeapi.py)
    │   └── CredentialsMissing  neither a service account nor a kubeconfig (kubeapi.py)
    └── WebhookTlsError         the webhook's TLS material cannot be made or read
                                (webhook_tls.py)

It imports nothing. Callers: ``runtime.py``, ``render/common.py``, ``admission.py``,
``kubeapi.py`` and ``webhook_tls.py`` (their errors derive from the root).
"""

from __future__ import annotations

__all__ = ["OperatorError"]


class OperatorError(Exception):
    """Root of every error the operator raises deliberately (see the module docstring)."""
