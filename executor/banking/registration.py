"""Register the banking family's handlers: every action this build mirrors, one adapter each.

:func:`banking_handlers` registers each :data:`~agentsafe.executor.banking.actions.ACTIONS`
entry under its handler name (``banking.credit_transfer.sepa``, ...), each an
:class:`~agentsafe.executor.effects.adapter.AdapterHandler` over a
:class:`~agentsafe.executor.banking.transport.CoreBankingHttpAdapter` sharing the reference
handler's dispatch path, the effect register and the provider keys, and returns the names in
registration order. ``BANKING_ADAPTER_ID`` and ``BANKING_ADAPTER_VERSION`` are the observer the
effect evidence names.

Callers: ``assembly.py`` (when the policy names a ``banking.`` handler); tests.
"""

from __future__ import annotations

from ..dispatch.effects import EffectRegister
from ..dispatch.forward import ForwardRequestHandler
from ..dispatch.seam import Registry
from ..effects.adapter import AdapterHandler
from ..effects.receipts import ProviderKeys
from ..egress.credentials import DownstreamCredential
from ..egress.transport import Transport
from ..events import EventSink
from .actions import ACTIONS
from .transport import CoreBankingHttpAdapter

__all__ = ["HANDLER_PREFIX", "banking_handlers"]

HANDLER_PREFIX = "banking."


def banking_handlers(
    registry: Registry,
    *,
    forward: ForwardRequestHandler,
    transport: Transport,
    credential: DownstreamCredential | None,
    lookup_by_reference_url: str | None,
    timeout_ms: int,
    adapter_id: str,
    adapter_version: str,
    register: EffectRegister,
    receipts: ProviderKeys | None = None,
    security: EventSink | None = None,
) -> list[str]:
    """Register every banking action in ``registry``; the names in order."""
    names = []
    for name, kind in ACTIONS.items():
        adapter = CoreBankingHttpAdapter(
            kind,
            forward=forward,
            transport=transport,
            credential=credential,
            lookup_by_reference_url=lookup_by_reference_url,
            timeout_ms=timeout_ms,
            adapter_id=adapter_id,
            adapter_version=adapter_version,
            security=security,
        )
        registry.register(name, AdapterHandler(adapter, register=register, receipts=receipts))
        names.append(name)
    return names
