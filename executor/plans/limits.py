"""Hard limits of the plan boundary: the ceilings no policy can raise.

A :class:`~agentsafe.executor.plans.policy.PlanPolicy` ceiling above its hard limit is refused.
The envelope budget (``maxEnvelope*``) is the cumulative pre-signature budget every public
operation spends across all of its JSON inputs and outputs: dry runs, approval requests, approval
step arrays, contexts and source maps, execution evidence, consumption records and receipts,
counting the UTF-8 bytes of keys and values alike.

Callers: ``policy.py`` (field bounds), ``snapshot.py`` (budgets), every operation.
Also imported by ``__init__.py``, ``approval.py``, ``citations.py``, ``dryrun.py``,
``receipts.py``, ``shapes.py``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

__all__ = ["AGENT_SAFETY_HARD_LIMITS", "DEFAULT_POLICY_LIMITS"]

AGENT_SAFETY_HARD_LIMITS: Final[MappingProxyType[str, int]] = MappingProxyType(
    {
        # policy ceilings
        "maxSteps": 64,
        "maxRows": 1_000_000,
        "maxBytes": 64 * 1024 * 1024,
        "maxFieldsPerStep": 256,
        "maxAuthorizationScopesPerSource": 64,
        "maxCitationsPerSource": 64,
        "maxSources": 64,
        "maxOperationParameterBytes": 256 * 1024,
        "maxOperationParameterNodes": 4096,
        "maxOperationParameterDepth": 32,
        "maxProvenanceAgeMs": 30 * 24 * 60 * 60 * 1000,
        "maxApprovalLifetimeMs": 24 * 60 * 60 * 1000,
        "maxClockSkewMs": 5 * 60 * 1000,
        # the cumulative pre-signature budget of one public operation
        "maxEnvelopeBytes": 2 * 1024 * 1024,
        "maxEnvelopeNodes": 100_000,
        "maxEnvelopeDepth": 16,
        "maxEnvelopeContainers": 20_000,
        # any single array or object, anywhere (checked before it is read)
        "maxCollectionLength": 4096,
        # executor results (bytes are bounded by the approved step ceiling)
        "maxResultNodes": 1_000_000,
        "maxResultDepth": 64,
        "maxResultContainers": 250_000,
        # strings
        "maxIdentifierLength": 128,
        "maxTextLength": 1024,
        "maxCitationLength": 2048,
        "maxPercentDecodeRounds": 4,
    }
)
"""Module-level hard limits; a policy ceiling above one of these is refused."""

DEFAULT_POLICY_LIMITS: Final[MappingProxyType[str, int]] = MappingProxyType(
    {
        "maxSteps": 8,
        "maxRows": 10_000,
        "maxBytes": 4 * 1024 * 1024,
        "maxFieldsPerStep": 32,
        "maxAuthorizationScopesPerSource": 8,
        "maxCitationsPerSource": 8,
        "maxOperationParameterBytes": 16 * 1024,
        "maxOperationParameterNodes": 256,
        "maxOperationParameterDepth": 8,
        "maxApprovalLifetimeMs": 15 * 60 * 1000,
    }
)
"""Ceilings a policy gets when it does not name them."""
