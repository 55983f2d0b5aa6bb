"""The executor's configuration: every variable one row of a table, parsed once, checked whole.

Role: turn the process environment into one frozen :class:`ExecutorConfig` that every other
component reads (``config.executor_mode``, ``config.downstream_url``, ...), or refuse to start with
a :class:`~agentsafe.executor.errors.ConfigError` that names the variable and never its value
(exit status 78). This package's face re-exports its public names; the rooms behind it:

- ``config/values.py``: constants, enumerations and :class:`SecretSource`;
- ``config/table.py``: one declarative row per variable (type, kind, default, bounds, group,
  secret or not, meaning), from which :data:`CONFIG_KEYS`, :data:`SECRET_NAMES`, the parsing and
  ``docs/configuration.md``'s variable tables are generated;
- ``config/parsing.py``: how each kind of value is read, and :func:`check_downstream_url`;
- ``config/rules.py``: the rules between variables;
- ``config/model.py``: :class:`ExecutorConfig`, the rows plus their parsing, rules and readers;
- ``config/loading.py``: :func:`load_config` (unknown names, empty values, secret sources, and
  pydantic's errors in our own words).

Presentation (``agentsafe config``) is ``tools/config_view.py``; the documentation generator is
``tools/config_docs.py``.

Callers: ``assembly.py`` (start order: configuration comes second, after the audit hook),
``plane.py``, ``serve.py``, ``proxy.py``, ``supervisor.py``, ``cli.py``, ``host/secrets.py``
(which secrets were given and how, through :meth:`ExecutorConfig.secret_source`),
``host/posture.py``, ``tools/doctor.py``, ``tools/config_view.py``, ``tools/config_docs.py``,
and the operator (``operator/models.py``, ``operator/render/workload.py``), which renders an
executor's environment from the same list and judges admission with the same code; main callers
only, many modules read single constants.

Why a plain pydantic model and not pydantic-settings: the environment is taken as an explicit
mapping (tests and ``agentsafe config`` pass their own), every ``EXECUTOR_*``/``DOWNSTREAM_*``
variable we do not know must be refused rather than ignored, a secret's value must never enter
this object (only whether it was given, as ``<NAME>`` or ``<NAME>_FILE``), the provenance of each
value (environment, file, default) is reported, and error messages must never carry an input
value. pydantic-settings reads ``os.environ``, ``.env`` files and secret directories itself and
would read secret values; each of those would have to be switched off or worked around. So
:func:`load_config` does the environment-specific work (unknown names, empty values, secret
sources) and hands a dict of raw strings to an ordinary frozen pydantic model whose validators
parse strictly (booleans are ``true``/``false`` only, integers are plain decimal digits, enums
match exactly) and whose model validator applies the cross-field rules.

A note for deployments: Kubernetes injects ``<SERVICE>_SERVICE_HOST``/``<SERVICE>_PORT_*``
variables for every Service in the namespace. A Service named ``executor`` or ``downstream``
would therefore inject unknown ``EXECUTOR_*``/``DOWNSTREAM_*`` variables, which are refused; pods
run with ``enableServiceLinks: false``.
"""

from __future__ import annotations

from ..windows import LockoutRule, RateRule
from .loading import load_config
from .model import ExecutorConfig
from .parsing import check_downstream_url, is_production, iso4217_listed
from .table import CONFIG_KEYS, SECRET_NAMES
from .values import (
    BODY_TIMEOUT_SECONDS_DEFAULT,
    CURRENCY_PATTERN,
    DOWNSTREAM_TIMEOUT_MS_DEFAULT,
    DOWNSTREAM_TIMEOUT_MS_MAX,
    HARD_LIMIT_WINDOW_COUNT_MAX,
    HARD_LIMIT_WINDOW_SECONDS_MAX,
    HEADER_TIMEOUT_SECONDS_DEFAULT,
    IDEMPOTENCY_KEY_PLACEHOLDER,
    INTENT_TTL_SECONDS_DEFAULT,
    INTENT_TTL_SECONDS_MAX,
    LEASE_MARGIN_SECONDS,
    LEASE_RENEWALS_PER_LEASE,
    MAX_CONNECTIONS_DEFAULT,
    MAX_CONNECTIONS_PER_SOURCE_DEFAULT,
    MAX_TEXT,
    PRODUCTION,
    PROVIDER_REFERENCE_PLACEHOLDER,
    SECRET_FILE_SUFFIX,
    WORKERS_DEFAULT,
    WORKERS_MAX,
    CredentialKind,
    EffectMismatchAction,
    EscalationMode,
    ExecutorMode,
    PostureMode,
    PrivateKeyAlgorithm,
    SecretOrigin,
    SecretSource,
    SigningAlgorithm,
    TlsMinVersion,
)

__all__ = [
    "BODY_TIMEOUT_SECONDS_DEFAULT",
    "CONFIG_KEYS",
    "CURRENCY_PATTERN",
    "DOWNSTREAM_TIMEOUT_MS_DEFAULT",
    "DOWNSTREAM_TIMEOUT_MS_MAX",
    "HARD_LIMIT_WINDOW_COUNT_MAX",
    "HARD_LIMIT_WINDOW_SECONDS_MAX",
    "HEADER_TIMEOUT_SECONDS_DEFAULT",
    "IDEMPOTENCY_KEY_PLACEHOLDER",
    "INTENT_TTL_SECONDS_DEFAULT",
    "INTENT_TTL_SECONDS_MAX",
    "LEASE_MARGIN_SECONDS",
    "LEASE_RENEWALS_PER_LEASE",
    "MAX_CONNECTIONS_DEFAULT",
    "MAX_CONNECTIONS_PER_SOURCE_DEFAULT",
    "MAX_TEXT",
    "PRODUCTION",
    "PROVIDER_REFERENCE_PLACEHOLDER",
    "SECRET_FILE_SUFFIX",
    "SECRET_NAMES",
    "WORKERS_DEFAULT",
    "WORKERS_MAX",
    "CredentialKind",
    "EffectMismatchAction",
    "EscalationMode",
    "ExecutorConfig",
    "ExecutorMode",
    "LockoutRule",
    "PostureMode",
    "PrivateKeyAlgorithm",
    "RateRule",
    "SecretOrigin",
    "SecretSource",
    "SigningAlgorithm",
    "TlsMinVersion",
    "check_downstream_url",
    "is_production",
    "iso4217_listed",
    "load_config",
]
