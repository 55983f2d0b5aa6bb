"""The downstream target an intent names: a plain value with no dependencies.

Role: :class:`DownstreamTarget` is what both the configuration (``DOWNSTREAM_SYSTEM``,
``_OPERATION``, ``_ENVIRONMENT`` and the endpoint of ``DOWNSTREAM_URL``) and intent capture
(the binding's ``downstream_target``) speak of. It lives on its own so the configuration never
imports intent capture; ``intent.py`` re-exports it under its old name.

Callers: ``intent.py`` (re-exports it), ``config/model.py``
(:meth:`ExecutorConfig.downstream_target`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DownstreamTarget"]


@dataclass(frozen=True)
class DownstreamTarget:
    """The downstream target an intent names (``DOWNSTREAM_SYSTEM``, ``_OPERATION``, the
    endpoint of ``DOWNSTREAM_URL`` and, when set, ``DOWNSTREAM_ENVIRONMENT``). Without an
    environment the binding has exactly the three members the peer vectors hash."""

    system: str
    operation: str
    endpoint: str
    environment: str | None = None

    def as_binding(self) -> dict[str, str]:
        binding = {"system": self.system, "operation": self.operation, "endpoint": self.endpoint}
        if self.environment is not None:
            binding["environment"] = self.environment
        return binding
