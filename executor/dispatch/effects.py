"""The effect register: the one place a handler records what it observed a provider do.

Every execution's observation is registered here against the exact authorization (the grant id),
inside the handler, and taken once by the attempt after the registry returns. The attempt then
hands it to the policy authority's finalization (``effect=``, with the provider's receipt), writes
the one ``EFFECT_OBSERVED`` evidence line, and (for an adapter's record) reports a mismatch. The
provider's receipt does not travel here: the seam carries it (``dispatch/seam.py``). A
refusal's observation is registered before the handler raises, so it reaches the finalization and
the evidence although the answer has no effect block.

Two kinds of entry share the register (:class:`EffectEvidence`):

* an ordinary handler calls :meth:`EffectRegister.record` with its observation (``seam.effects``,
  ``dispatch/registration.py``): a :class:`HandlerObservation` keeps only the SHA-256 of the
  observation's canonical JSON, never the observation itself, which may carry provider data;
* the effect plane's adapter bridge (``effects/adapter.py``) puts its
  :class:`~agentsafe.executor.effects.adapter.EffectRecord`: the outcome, the confirmation, the
  field-by-field comparison and the receipt comparison, digests only.

One entry per authorization: a later one for the same grant replaces the earlier (the last thing
a handler observed is what it finalizes with).

Callers: ``dispatch/registration.py`` (``Seam.effects``), ``effects/adapter.py`` (puts records),
``lifecycle/attempt.py`` (takes them), ``assembly.py`` (one register per process).
Also imported by ``banking/registration.py``, ``lifecycle/pipeline.py``, ``tools/doctor.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..canonical import sha256_digest
from .seam import ExecutionContext

__all__ = ["EffectEvidence", "EffectRegister", "HandlerObservation"]


class EffectEvidence(Protocol):
    """What the register holds for one authorization."""

    @property
    def grant_id(self) -> str: ...

    @property
    def digest(self) -> str:
        """``record_digest``: SHA-256 over the entry's other evidence fields, the name the
        answer's effect block, the evidence line and the finalization share."""
        ...

    def evidence(self) -> dict[str, Any]:
        """The ``EFFECT_OBSERVED`` line's fields and what the finalization carries (ending with
        ``record_digest``): digests, names and states, never a provider body, a parameter or a
        credential."""
        ...


@dataclass(frozen=True)
class HandlerObservation:
    """An ordinary handler's observation: the digest of what it saw, bound to its grant."""

    grant_id: str
    intent_hash: str
    dossier_id: str
    observation_digest: str

    def _fields(self) -> dict[str, Any]:
        return {
            "intent_hash": self.intent_hash,
            "grant_id": self.grant_id,
            "dossier_id": self.dossier_id,
            "observation_digest": self.observation_digest,
        }

    @property
    def digest(self) -> str:
        return sha256_digest(self._fields())

    def evidence(self) -> dict[str, Any]:
        return {**self._fields(), "record_digest": self.digest}


class EffectRegister:
    """Effect evidence by grant id, put inside an execution and taken once by the attempt."""

    def __init__(self) -> None:
        self._entries: dict[str, EffectEvidence] = {}
        self._lock = threading.Lock()

    def put(self, entry: EffectEvidence) -> None:
        """Register ``entry`` against its grant (replacing an earlier one for that grant)."""
        with self._lock:
            self._entries[entry.grant_id] = entry

    def record(self, ctx: ExecutionContext, observation: Mapping[str, Any]) -> str:
        """Register an ordinary handler's ``observation`` for ``ctx``'s authorization; returns
        its digest, which the handler may put in its result so the outcome, the evidence and
        the finalization name the same thing."""
        digest = sha256_digest(dict(observation))
        self.put(
            HandlerObservation(
                grant_id=ctx.authorization.grant_id,
                intent_hash=ctx.intent.intent_hash,
                dossier_id=ctx.authorization.dossier_id,
                observation_digest=digest,
            )
        )
        return digest

    def take(self, grant_id: str) -> EffectEvidence | None:
        """The entry registered for ``grant_id``, removed (``None`` when there is none)."""
        with self._lock:
            return self._entries.pop(grant_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
