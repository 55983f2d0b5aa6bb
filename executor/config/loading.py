"""Loading the configuration from an environment: the one entry, :func:`load_config`.

Role: the environment-specific work before the model sees a value: every ``EXECUTOR_*`` and
``DOWNSTREAM_*`` name must be a row of the table (a typo must not fall back to a default), an
empty value is refused, a secret is recorded only as given as ``<NAME>`` or ``<NAME>_FILE``
(never its value), and pydantic's ``ValidationError`` is translated into a
:class:`~agentsafe.executor.errors.ConfigError` built from our own words and the field's
declared bounds, never from the input.

Callers: ``config/__init__.py`` (the public face, through which assembly, serve, proxy, doctor,
``agentsafe config`` and the operator's rendering all load).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import annotated_types
from pydantic import ValidationError

from ..errors import ConfigError
from .model import ExecutorConfig
from .parsing import is_production
from .table import CONFIG_KEYS, FILE_KEYS, SECRET_NAMES
from .values import SECRET_FILE_SUFFIX, SecretOrigin, SecretSource

__all__ = ["load_config"]

# Prefixes whose every variable must be one we know: a typo must not fall back to a default.
_OWNED_PREFIXES: Final = ("EXECUTOR_", "DOWNSTREAM_")
_FILE_KEYS: Final = FILE_KEYS
_KNOWN: Final = frozenset(CONFIG_KEYS)
_ATTRIBUTE_TO_KEY: Final = {key.lower(): key for key in CONFIG_KEYS if key not in _FILE_KEYS}


def _relevant(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables this module reads; refuses unknown owned names and empty values."""
    unknown = sorted(
        key for key in environ if key.startswith(_OWNED_PREFIXES) and key not in _KNOWN
    )
    if unknown:
        raise ConfigError(unknown[0], "is not a variable the executor knows (a typo?)")
    relevant: dict[str, str] = {}
    for key in CONFIG_KEYS:
        if key not in environ:
            continue
        value = environ[key]
        if value == "":
            raise ConfigError(key, "is set but empty; give a value or unset it")
        relevant[key] = value
    return relevant


def _secret_sources(env: Mapping[str, str], *, production: bool) -> dict[str, SecretSource]:
    sources: dict[str, SecretSource] = {}
    for name in SECRET_NAMES:
        file_key = name + SECRET_FILE_SUFFIX
        if name in env and file_key in env:
            raise ConfigError(name, f"give either {name} or {file_key}, never both")
        if file_key in env:
            path = env[file_key]
            if "\x00" in path or any(not ch.isprintable() for ch in path):
                raise ConfigError(file_key, "must be a path without control characters")
            sources[name.lower()] = SecretSource(name, SecretOrigin.FILE, path)
        elif name in env:
            if production:
                raise ConfigError(name, f"under AGENTSAFE_ENV=production give it as {file_key}")
            sources[name.lower()] = SecretSource(name, SecretOrigin.ENV)
    return sources


def load_config(environ: Mapping[str, str]) -> ExecutorConfig:
    """Parse and check the executor's configuration from ``environ``.

    Raises :class:`ConfigError` naming the first variable at fault, never its value.
    """
    env = _relevant(environ)
    production = is_production(env)
    data: dict[str, Any] = {
        key.lower(): value
        for key, value in env.items()
        if key not in _FILE_KEYS and key not in SECRET_NAMES
    }
    data.update(_secret_sources(env, production=production))
    try:
        return ExecutorConfig.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc, env) from None


def _translate(exc: ValidationError, env: Mapping[str, str]) -> ConfigError:
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = error.get("loc") or ()
    attribute = str(loc[0]) if loc else ""
    variable = _ATTRIBUTE_TO_KEY.get(attribute, attribute.upper() or "configuration")
    problem = _problem(error, attribute)
    raw = env.get(variable)
    if raw is not None and len(raw) >= 8 and raw in problem:
        problem = "has an invalid value"
    return ConfigError(variable, problem)


def _problem(error: Mapping[str, Any], attribute: str) -> str:
    kind = str(error.get("type", ""))
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind in ("value_error", "assertion_error"):
        message = str(ctx.get("error", "")) or str(error.get("msg", ""))
        return message or "has an invalid value"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        low, high = _bounds(attribute)
        if low is not None and high is not None:
            return f"must be a whole number from {low} to {high}"
        return "is out of range"
    if kind == "enum":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"must be {expected}" if expected else "is not one of the allowed values"
    if kind.startswith("int"):
        return "must be a whole number written in decimal digits"
    if kind.startswith("bool"):
        return "must be true or false"
    return "has an invalid value"


def _bounds(attribute: str) -> tuple[int | None, int | None]:
    field = ExecutorConfig.model_fields.get(attribute)
    low: int | None = None
    high: int | None = None
    for item in field.metadata if field is not None else ():
        if isinstance(item, annotated_types.Ge):
            low = int(item.ge)  # type: ignore[call-overload]
        elif isinstance(item, annotated_types.Le):
            high = int(item.le)  # type: ignore[call-overload]
    return low, high
