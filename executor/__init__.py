"""agentsafe.executor: the trusted executor between agent proposals and real side effects.

An agent proposes; the executor authenticates the caller, pins the exact intent (RFC 8785, SHA-256),
asks the policy authority for ALLOW / BLOCK / ESCALATE, and on ALLOW claims a single-use grant,
journals the attempt durably, runs the registered handler once and leaves evidence.

This package knows nothing of Kubernetes.
"""

from .canonical import canonical_json, sha256_digest
from .errors import AgentSafeError

__all__ = ["AgentSafeError", "canonical_json", "sha256_digest"]
__version__ = "0.1.0"
