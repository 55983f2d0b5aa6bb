"""The rows plus the readers the cross-field rules need: ``production``, ``legacy_mode``,
``secret_source``.

Role: :class:`Readers` sits between :class:`~.table.Variables` (one row per variable) and
:class:`~.model.ExecutorConfig`, so that ``config/rules.py`` can name the type it checks without
importing the model that runs it (no import cycle, not even one for the type checker).

Callers: ``config/model.py`` (``ExecutorConfig`` extends it), ``config/rules.py`` (the type it
checks). :meth:`Readers.tracing_environment` is read by the assembly through the config
object.
"""

from __future__ import annotations

from .table import SECRET_NAMES, Variables
from .values import PRODUCTION, SecretSource

__all__ = ["Readers"]


class Readers(Variables):
    """The rows, and the readers that the cross-field rules and the rest of the code share."""

    @property
    def production(self) -> bool:
        return (self.agentsafe_env or "").strip().lower() == PRODUCTION

    @property
    def legacy_mode(self) -> bool:
        """No principals file: one PROPOSER synthesised from the EXECUTOR_TENANT_ID/ACTOR_*."""
        return self.executor_principals_file is None

    def secret_source(self, name: str) -> SecretSource:
        """How the secret ``name`` (one of :data:`~.table.SECRET_NAMES`) was given."""
        if name not in SECRET_NAMES:
            raise KeyError(name)
        source: SecretSource = getattr(self, name.lower())
        return source

    def tracing_environment(self) -> dict[str, str]:
        """The ``OTEL_*`` rows that were given, by their variable names: what
        ``telemetry.configure`` reads (``assembly.py``), so each is read in one place."""
        return {
            key.upper(): value
            for key in type(self).model_fields
            if key.startswith("otel_") and isinstance(value := getattr(self, key), str)
        }

    def secret_sources(self) -> tuple[SecretSource, ...]:
        return tuple(self.secret_source(name) for name in SECRET_NAMES)
