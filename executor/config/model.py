"""The configuration as one frozen value: the table's rows, parsed by kind and checked as a whole.

Role: :class:`ExecutorConfig` is :class:`~.readers.Readers` (the rows, :class:`~.table.Variables`,
with the readers the rules need) plus three
things the rows do not say themselves: each field is read by its row's kind
(:data:`~.parsing.KINDS`: a parser before pydantic's type check, a check after it), the
cross-field rules of ``config/rules.py`` run once every field is read, and the readers the rest
of the code uses (``config.production``, ``config.downstream_target()``,
``config.secret_source(name)``, ``config.digest()``). Build one with
:func:`~.loading.load_config`; constructing it directly runs the same field and cross-field
rules.

Callers: ``config/__init__.py`` (the public face), ``config/loading.py``.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import ValidationInfo, field_validator, model_validator

from ..canonical import sha256_digest
from ..principals import Actor
from ..target import DownstreamTarget
from ..windows import LockoutRule, RateRule
from . import rules
from .parsing import KINDS, Check
from .readers import Readers
from .table import ROWS
from .values import ExecutorMode, SecretSource, rule_text

__all__ = ["ExecutorConfig"]


def _checks(stage: int) -> dict[str, Check]:
    """Each row's parser (stage 0, before pydantic's type check) or check (stage 1, after)."""
    found: dict[str, Check] = {}
    for row in ROWS:
        check = KINDS[row.kind][stage]
        if check is not None:
            found[row.attribute] = check
    return found


_BEFORE: Final = _checks(0)
_AFTER: Final = _checks(1)


class ExecutorConfig(Readers):
    """Every configuration variable of the executor, typed; attribute = lower-cased variable.

    Secrets are :class:`~.values.SecretSource` records (given or not, from the environment or a
    file), never values. Build one with :func:`~.loading.load_config`; constructing it directly
    runs the same field and cross-field rules.
    """

    # ---- field parsing: each row's kind ------------------------------------------------

    @field_validator("*", mode="before")
    @classmethod
    def _parse(cls, value: object, info: ValidationInfo) -> object:
        parse = _BEFORE.get(str(info.field_name))
        return parse(value) if parse is not None else value

    @field_validator("*", mode="after")
    @classmethod
    def _check(cls, value: object, info: ValidationInfo) -> object:
        check = _AFTER.get(str(info.field_name))
        return check(value) if check is not None else value

    # ---- cross-field rules (config/rules.py) --------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: object) -> object:
        return rules.kind_defaults(data)

    @model_validator(mode="after")
    def _rules(self) -> ExecutorConfig:
        rules.check(self)
        return self

    # ---- what the rest of the code reads ------------------------------------------------

    @property
    def replica_id(self) -> str:
        """``EXECUTOR_REPLICA_ID``, or this host's name (the pod name on Kubernetes)."""
        return self.executor_replica_id or os.uname().nodename

    @property
    def enforcement(self) -> bool:
        return self.executor_mode is ExecutorMode.ENFORCEMENT

    @property
    def legacy_actor(self) -> Actor | None:
        """The actor legacy mode's one caller names, or ``None`` with a principals file."""
        if not self.legacy_mode or self.executor_actor_id is None:
            return None
        assert self.executor_actor_type is not None
        return Actor(self.executor_actor_id, self.executor_actor_type, self.executor_actor_runtime)

    @property
    def downstream_endpoint(self) -> str:
        """``POST <path of DOWNSTREAM_URL>``: the endpoint the intent's target names."""
        return f"POST {urlsplit(self.downstream_url).path or '/'}"

    def downstream_target(self) -> DownstreamTarget:
        return DownstreamTarget(
            system=self.downstream_system,
            operation=self.downstream_operation,
            endpoint=self.downstream_endpoint,
            environment=self.downstream_environment,
        )

    def public_view(self) -> dict[str, Any]:
        """The configuration as JSON values, secrets only as their source (for digests, status).

        Holds no secret value and no digest of one.
        """
        view: dict[str, Any] = {}
        for attribute in type(self).model_fields:
            view[attribute.upper()] = _json_value(getattr(self, attribute))
        return view

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`public_view` in canonical JSON (the evidence manifest's)."""
        return sha256_digest(self.public_view())


def _json_value(value: object) -> Any:
    if isinstance(value, SecretSource):
        return {"origin": value.origin.value, "path": value.path}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, RateRule | LockoutRule):
        return rule_text(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value
