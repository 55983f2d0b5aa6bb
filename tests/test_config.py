"""Tests for ``agentsafe.executor.config``: parsing, defaults, every refusal, and ``describe``.

Every refusal asserts two things: the message names the variable, and it does not contain the
offending value (a refusal to start must never print a value, secrets least of all).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console

from agentsafe.executor.canonical import MAX_SAFE_INTEGER
from agentsafe.executor.config import (
    CONFIG_KEYS,
    SECRET_NAMES,
    WORKERS_DEFAULT,
    WORKERS_MAX,
    CredentialKind,
    EffectMismatchAction,
    EscalationMode,
    ExecutorConfig,
    ExecutorMode,
    LockoutRule,
    PostureMode,
    PrivateKeyAlgorithm,
    RateRule,
    SecretOrigin,
    SecretSource,
    SigningAlgorithm,
    TlsMinVersion,
    is_production,
    load_config,
)
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.intent import DownstreamTarget
from agentsafe.executor.principals import Actor
from agentsafe.executor.tools.config_view import ConfigRow, describe_config, render_config_table

TENANT = "00000000-0000-4000-8000-000000000001"
CALLER_TOKEN = "caller-token-value-7f3e9a"
DOWNSTREAM_SECRET = "Bearer downstream-secret-4c1d"
REPO = Path(__file__).resolve().parent.parent


def _pin(seed: str) -> str:
    return "sha256/" + base64.b64encode(hashlib.sha256(seed.encode()).digest()).decode()


def legacy_env(**overrides: str | None) -> dict[str, str]:
    """A valid legacy-mode, enforcement, plaintext developer configuration plus overrides.

    An override of ``None`` removes the variable.
    """
    env = {
        "EXECUTOR_MODE": "ENFORCEMENT",
        "EXECUTOR_POLICY_FILE": "/etc/agentsafe/policy.yaml",
        "EXECUTOR_STATE_DIR": "/var/lib/agentsafe/state",
        "EXECUTOR_JOURNAL_DIR": "/var/lib/agentsafe/journal",
        "EXECUTOR_TENANT_ID": TENANT,
        "EXECUTOR_ACTOR_ID": "synthetic-payout-agent",
        "EXECUTOR_ACTOR_TYPE": "AI_AGENT",
        "EXECUTOR_CALLER_TOKEN": CALLER_TOKEN,
        "EXECUTOR_ALLOW_PLAINTEXT_LISTENER": "true",
        "EXECUTOR_POSTURE": "DEVELOPMENT",
        "DOWNSTREAM_URL": "https://provider.example/v1/payouts",
        "DOWNSTREAM_SYSTEM": "synthetic-provider",
        "DOWNSTREAM_OPERATION": "create_payout",
        "DOWNSTREAM_CREDENTIAL_HEADER": "authorization",
        "DOWNSTREAM_CREDENTIAL": DOWNSTREAM_SECRET,
        # Variables that are not ours are ignored.
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/agentsafe",
    }
    return _apply(env, overrides)


def production_env(**overrides: str | None) -> dict[str, str]:
    """A valid production configuration: principals file, TLS, secrets only as files."""
    env = {
        "AGENTSAFE_ENV": "production",
        "EXECUTOR_MODE": "ENFORCEMENT",
        "EXECUTOR_POLICY_FILE": "/etc/agentsafe/policy.yaml",
        "EXECUTOR_STATE_DIR": "/var/lib/agentsafe/state",
        "EXECUTOR_JOURNAL_DIR": "/var/lib/agentsafe/journal",
        "EXECUTOR_PRINCIPALS_FILE": "/var/run/agent-safe/principals.json",
        "EXECUTOR_SECRETS_DIR": "/var/run/agent-safe/secrets",
        "EXECUTOR_TLS_CERT_FILE": "/var/run/agent-safe/tls/tls.crt",
        "EXECUTOR_TLS_KEY_FILE": "/var/run/agent-safe/secrets/tls.key",
        "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE": "/var/run/agent-safe/secrets/authority.pem",
        "DOWNSTREAM_URL": "https://provider.example/v1/payouts",
        "DOWNSTREAM_SYSTEM": "synthetic-provider",
        "DOWNSTREAM_OPERATION": "create_payout",
        "DOWNSTREAM_CREDENTIAL_HEADER": "authorization",
        "DOWNSTREAM_CREDENTIAL_FILE": "/var/run/agent-safe/secrets/downstream",
    }
    return _apply(env, overrides)


def _apply(env: dict[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def refused(env: Mapping[str, str], variable: str, *values: str) -> ConfigError:
    """Load ``env``, expect a refusal naming ``variable`` and containing none of ``values``."""
    with pytest.raises(ConfigError) as caught:
        load_config(env)
    error = caught.value
    text = str(error)
    assert error.variable == variable, text
    assert text.startswith(variable + ":"), text
    assert error.exit_status == 78
    assert error.code == "CONFIG_INVALID"
    for value in values:
        assert value not in text, (value, text)
    assert error.__cause__ is None
    return error


# --------------------------------------------------------------------------------------------
# The list and the model


def test_config_keys_are_unique_and_match_the_model() -> None:
    assert len(CONFIG_KEYS) == len(set(CONFIG_KEYS))
    files = {name + "_FILE" for name in SECRET_NAMES}
    assert files <= set(CONFIG_KEYS)
    assert set(SECRET_NAMES) <= set(CONFIG_KEYS)
    attributes = {key.lower() for key in CONFIG_KEYS if key not in files}
    assert attributes == set(ExecutorConfig.model_fields)


def test_not_ours_are_absent_from_the_list() -> None:
    assert not [k for k in CONFIG_KEYS if k.startswith(("DECIONIS_", "PRESENCE_", "NODE_"))]


def test_secret_names_are_the_seven_secrets() -> None:
    assert SECRET_NAMES == (
        "EXECUTOR_CALLER_TOKEN",
        "EXECUTOR_TLS_KEY",
        "EXECUTOR_AUTHORITY_SIGNING_KEY",
        "EXECUTOR_EVIDENCE_SIGNING_KEY",
        "DOWNSTREAM_CREDENTIAL",
        "DOWNSTREAM_PRIVATE_KEY",
        "DOWNSTREAM_SIGNING_KEY",
        "EXECUTOR_STORE_URL",
    )


def test_every_key_is_documented() -> None:
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [key for key in CONFIG_KEYS if f"`{key}`" not in text]
    assert missing == []


def test_defaults() -> None:
    config = load_config(legacy_env())
    assert config.agentsafe_env is None
    assert config.executor_bind_address == "127.0.0.1"
    assert config.port == 8443
    assert config.executor_intent_ttl_seconds == 60
    assert config.executor_allow_legacy_caller is False
    assert config.executor_jwks_refresh_seconds == 300
    assert config.executor_jwt_clock_tolerance_seconds == 30
    assert config.executor_rate_limit_unauthenticated == RateRule(20, 60)
    assert config.executor_auth_lockout == LockoutRule(10, 60, 300)
    assert config.executor_escalation is EscalationMode.NONE
    assert config.executor_posture_interval_seconds == 60
    assert config.executor_tls_min_version is TlsMinVersion.TLS_1_3
    assert config.executor_egress_max_response_bytes == 1024 * 1024
    assert config.executor_journal_required is True
    assert config.executor_journal_retain_days == 7
    assert config.executor_ready_requires_no_unknown_attempts is False
    assert config.executor_halt_on_auth_failures == RateRule(50, 60)
    assert config.executor_halt_on_egress_refusals == RateRule(5, 60)
    assert config.executor_hard_limit_single_minor == {}
    assert config.executor_hard_limit_window_seconds is None
    assert config.executor_max_clock_skew_ms == 2000
    assert config.executor_audit_checkpoint_lines == 100
    assert config.executor_evidence_window_lines == 5000
    assert config.executor_on_effect_mismatch is EffectMismatchAction.HALT
    assert config.banking_adapter_id == "AGENTSAFE_CORE_BANKING"
    assert config.banking_adapter_version == "0.1.0"
    assert config.downstream_timeout_ms == 10_000
    assert config.downstream_credential_kind is CredentialKind.STATIC_HEADER
    assert config.downstream_allow_insecure_loopback is False
    # The other kinds' choices stay absent rather than defaulted.
    assert config.downstream_private_key_algorithm is None
    assert config.downstream_signing_algorithm is None
    # Nothing that identifies a tenant, system, person or network path has a default.
    for attribute in (
        "executor_principals_file",
        "executor_secrets_dir",
        "executor_halt_file",
        "executor_evidence_dir",
        "executor_jwks_url",
        "downstream_lookup_url",
        "executor_image_digest",
    ):
        assert getattr(config, attribute) is None, attribute


def test_required_without_defaults() -> None:
    for variable in (
        "EXECUTOR_MODE",
        "EXECUTOR_POLICY_FILE",
        "EXECUTOR_STATE_DIR",
        "DOWNSTREAM_URL",
        "DOWNSTREAM_SYSTEM",
        "DOWNSTREAM_OPERATION",
    ):
        error = refused(legacy_env(**{variable: None}), variable)
        assert "required" in error.problem


def test_parsed_values() -> None:
    config = load_config(
        legacy_env(
            EXECUTOR_MODE="SHADOW",
            EXECUTOR_BIND_ADDRESS="::",
            PORT="9443",
            EXECUTOR_INTENT_TTL_SECONDS="300",
            EXECUTOR_TLS_MIN_VERSION="1.2",
            EXECUTOR_ACTOR_RUNTIME="workflow-runner",
            EXECUTOR_RATE_LIMIT_UNAUTHENTICATED="5/10",
            EXECUTOR_AUTH_LOCKOUT="0/0/0",
            EXECUTOR_HARD_LIMIT_SINGLE_MINOR="CHF:2500000000,EUR:1000000",
            EXECUTOR_HARD_LIMIT_WINDOW_SECONDS="3600",
            EXECUTOR_HARD_LIMIT_WINDOW_COUNT="10",
            EXECUTOR_HARD_LIMIT_WINDOW_SUM_MINOR="500000",
            EXECUTOR_ON_EFFECT_MISMATCH="ALERT",
            EXECUTOR_IMAGE_DIGEST="sha256:" + "ab" * 32,
            DOWNSTREAM_TIMEOUT_MS="15000",
            DOWNSTREAM_SPKI_PINS=f"{_pin('a')},{_pin('b')}",
        )
    )
    assert config.executor_mode is ExecutorMode.SHADOW
    assert config.enforcement is False
    assert config.executor_bind_address == "::"
    assert config.port == 9443
    assert config.executor_intent_ttl_seconds == 300
    assert config.executor_tls_min_version is TlsMinVersion.TLS_1_2
    assert config.executor_rate_limit_unauthenticated == RateRule(5, 10)
    assert not config.executor_auth_lockout.enabled
    assert config.executor_hard_limit_single_minor == {"CHF": 2_500_000_000, "EUR": 1_000_000}
    assert config.executor_hard_limit_window_seconds == 3600
    assert config.executor_hard_limit_window_count == 10
    assert config.executor_hard_limit_window_sum_minor == 500_000
    assert config.executor_on_effect_mismatch is EffectMismatchAction.ALERT
    assert config.downstream_timeout_ms == 15_000
    assert config.downstream_spki_pins == (_pin("a"), _pin("b"))
    assert config.legacy_actor == Actor("synthetic-payout-agent", "AI_AGENT", "workflow-runner")
    assert isinstance(config.executor_policy_file, Path)


def test_downstream_environment_is_the_targets_environment() -> None:
    """The specification's DOWNSTREAM_ENVIRONMENT names the target's environment; unset, the
    target keeps exactly today's three members (the peer vectors' bytes)."""
    config = load_config(legacy_env(DOWNSTREAM_ENVIRONMENT="sandbox"))
    assert config.downstream_environment == "sandbox"
    assert config.downstream_target().as_binding()["environment"] == "sandbox"
    plain = load_config(legacy_env()).downstream_target().as_binding()
    assert set(plain) == {"system", "operation", "endpoint"}
    for bad in (" sandbox", "sand\x07box", "x" * 10_000):
        refused(legacy_env(DOWNSTREAM_ENVIRONMENT=bad), "DOWNSTREAM_ENVIRONMENT")


def test_the_model_is_frozen() -> None:
    config = load_config(legacy_env())
    with pytest.raises(ValidationError):
        config.port = 1  # type: ignore[misc]


def test_direct_construction_runs_the_same_rules() -> None:
    fields = {key.lower(): value for key, value in legacy_env().items() if key.isupper()}
    fields.pop("path")
    fields.pop("home")
    fields.pop("executor_caller_token")
    fields.pop("downstream_credential")
    fields["executor_caller_token"] = SecretSource("EXECUTOR_CALLER_TOKEN", SecretOrigin.ENV)
    fields["downstream_credential"] = SecretSource("DOWNSTREAM_CREDENTIAL", SecretOrigin.ENV)
    config = ExecutorConfig.model_validate(fields)
    assert config.port == 8443
    fields["executor_escalation"] = "APPROVAL"
    fields["executor_mode"] = "SHADOW"
    with pytest.raises(ConfigError) as caught:
        ExecutorConfig.model_validate(fields)
    assert caught.value.variable == "EXECUTOR_ESCALATION"


# --------------------------------------------------------------------------------------------
# Strict scalar parsing


@pytest.mark.parametrize("value", ["True", "TRUE", "1", "yes", "on", "ture", "Fa1se"])
def test_booleans_are_strictly_true_or_false(value: str) -> None:
    variable = "EXECUTOR_READY_REQUIRES_NO_UNKNOWN_ATTEMPTS"
    error = refused(legacy_env(**{variable: value}), variable, value)
    assert error.problem == "must be true or false"


@pytest.mark.parametrize("value", [" true", "false ", "true\n"])
def test_booleans_with_blanks_are_refused(value: str) -> None:
    variable = "EXECUTOR_READY_REQUIRES_NO_UNKNOWN_ATTEMPTS"
    error = refused(legacy_env(**{variable: value}), variable)
    assert error.problem == "must be true or false"


@pytest.mark.parametrize("value", ["6e1", "+60", "0x3c", " 60", "60.0", "sixty", "-5", "６０"])
def test_integers_are_plain_decimal_digits(value: str) -> None:
    refused(legacy_env(EXECUTOR_INTENT_TTL_SECONDS=value), "EXECUTOR_INTENT_TTL_SECONDS", value)


RANGES = [
    ("EXECUTOR_INTENT_TTL_SECONDS", 1, 300),
    ("DOWNSTREAM_TIMEOUT_MS", 1, 15_000),
    ("EXECUTOR_EGRESS_MAX_RESPONSE_BYTES", 1024, 16 * 1024 * 1024),
    ("EXECUTOR_EVIDENCE_WINDOW_LINES", 100, 200_000),
    ("EXECUTOR_JOURNAL_RETAIN_DAYS", 1, 366),
    ("EXECUTOR_HOUSEKEEPING_INTERVAL_SECONDS", 1, 86_400),
    ("EXECUTOR_JWKS_REFRESH_SECONDS", 60, 86_400),
    ("EXECUTOR_JWT_CLOCK_TOLERANCE_SECONDS", 0, 300),
    ("EXECUTOR_POSTURE_INTERVAL_SECONDS", 10, 600),
    ("EXECUTOR_AUDIT_CHECKPOINT_LINES", 1, 100_000),
    ("EXECUTOR_MAX_CLOCK_SKEW_MS", 100, 60_000),
    ("PORT", 0, 65_535),
    ("EXECUTOR_WORKERS", 1, 16),
]


@pytest.mark.parametrize(("variable", "low", "high"), RANGES)
def test_integer_ranges(variable: str, low: int, high: int) -> None:
    attribute = variable.lower()
    assert getattr(load_config(legacy_env(**{variable: str(low)})), attribute) == low
    assert getattr(load_config(legacy_env(**{variable: str(high)})), attribute) == high
    below = str(low - 1) if low > 0 else None
    if below is not None:
        error = refused(legacy_env(**{variable: below}), variable)
        assert f"from {low} to {high}" in error.problem
    error = refused(legacy_env(**{variable: "987654321"}), variable, "987654321")
    assert f"from {low} to {high}" in error.problem


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EXECUTOR_MODE", "shadow"),
        ("EXECUTOR_MODE", "ENFORCING"),
        ("EXECUTOR_ESCALATION", "DIRECT"),
        ("EXECUTOR_ESCALATION", "MANAGED"),
        ("EXECUTOR_POSTURE", "enforced"),
        ("EXECUTOR_TLS_MIN_VERSION", "1.1"),
        ("EXECUTOR_ON_EFFECT_MISMATCH", "IGNORE"),
        ("DOWNSTREAM_CREDENTIAL_KIND", "BASIC_AUTH"),
    ],
)
def test_enumerations_match_exactly(variable: str, value: str) -> None:
    error = refused(legacy_env(**{variable: value}), variable, value)
    assert error.problem.startswith("must be ")


def test_empty_value_is_refused_not_defaulted() -> None:
    error = refused(legacy_env(EXECUTOR_INTENT_TTL_SECONDS=""), "EXECUTOR_INTENT_TTL_SECONDS")
    assert "empty" in error.problem


@pytest.mark.parametrize("name", ["EXECUTOR_INTENT_TTL", "EXECUTOR_MODEE", "DOWNSTREAM_URI"])
def test_unknown_owned_variable_is_refused(name: str) -> None:
    error = refused(legacy_env(**{name: "secret-looking-value-1"}), name, "secret-looking-value-1")
    assert "not a variable" in error.problem


def test_foreign_variables_are_ignored() -> None:
    load_config(legacy_env(AGENTSAFE_SURFACE="pip", DECIONIS_API_URL="https://x.example", LANG="C"))


def test_text_with_control_characters_is_refused() -> None:
    refused(legacy_env(DOWNSTREAM_SYSTEM="sys\nINJECTED"), "DOWNSTREAM_SYSTEM", "INJECTED")
    refused(legacy_env(EXECUTOR_ACTOR_ID=" padded-actor "), "EXECUTOR_ACTOR_ID", "padded-actor")
    refused(legacy_env(EXECUTOR_ACTOR_TYPE="x" * 600), "EXECUTOR_ACTOR_TYPE", "x" * 600)


def test_bind_address_must_be_an_address() -> None:
    refused(
        legacy_env(EXECUTOR_BIND_ADDRESS="listener.example"),
        "EXECUTOR_BIND_ADDRESS",
        "listener.example",
    )


@pytest.mark.parametrize(
    "value",
    [
        "00000000-0000-4000-8000-00000000000G",
        "00000000-0000-4000-8000-0000000000AB",
        "tenant-one-of-many",
        "{00000000-0000-4000-8000-000000000001}",
    ],
)
def test_tenant_id_must_be_a_lower_case_uuid(value: str) -> None:
    refused(legacy_env(EXECUTOR_TENANT_ID=value), "EXECUTOR_TENANT_ID", value)


@pytest.mark.parametrize(
    "variable",
    [
        "EXECUTOR_STATE_DIR",
        "EXECUTOR_JOURNAL_DIR",
        "EXECUTOR_SECRETS_DIR",
        "EXECUTOR_HALT_FILE",
        "EXECUTOR_EVIDENCE_DIR",
    ],
)
def test_writable_locations_must_be_absolute(variable: str) -> None:
    error = refused(legacy_env(**{variable: "relative/place"}), variable, "relative/place")
    assert "absolute" in error.problem


def test_image_digest_shape() -> None:
    digest = "registry.example/agentsafe@sha256:" + "0f" * 32
    assert load_config(legacy_env(EXECUTOR_IMAGE_DIGEST=digest)).executor_image_digest == digest
    refused(
        legacy_env(EXECUTOR_IMAGE_DIGEST="latest-build"), "EXECUTOR_IMAGE_DIGEST", "latest-build"
    )


# --------------------------------------------------------------------------------------------
# Rules, ceilings, pins


@pytest.mark.parametrize(("text", "rule"), [("20/60", RateRule(20, 60)), ("1/1", RateRule(1, 1))])
def test_rate_rule_parsing(text: str, rule: RateRule) -> None:
    assert (
        load_config(legacy_env(EXECUTOR_HALT_ON_AUTH_FAILURES=text)).executor_halt_on_auth_failures
        == rule
    )


@pytest.mark.parametrize("text", ["20", "20/0", "0/60", "a/b", "20/60/5", "-1/60", "20 /60", "/"])
@pytest.mark.parametrize(
    "variable",
    [
        "EXECUTOR_RATE_LIMIT_UNAUTHENTICATED",
        "EXECUTOR_HALT_ON_AUTH_FAILURES",
        "EXECUTOR_HALT_ON_EGRESS_REFUSALS",
    ],
)
def test_rate_rule_refusals(variable: str, text: str) -> None:
    refused(legacy_env(**{variable: text}), variable, *([text] if len(text) > 3 else []))


def test_lockout_rule_parsing() -> None:
    config = load_config(legacy_env(EXECUTOR_AUTH_LOCKOUT="3/30/900"))
    assert config.executor_auth_lockout == LockoutRule(3, 30, 900)
    assert config.executor_auth_lockout.enabled
    disabled = load_config(legacy_env(EXECUTOR_AUTH_LOCKOUT="0/60/300")).executor_auth_lockout
    assert not disabled.enabled


@pytest.mark.parametrize("text", ["10/60", "10/0/300", "10/60/0", "x/60/300", "10/60/300/1"])
def test_lockout_rule_refusals(text: str) -> None:
    refused(legacy_env(EXECUTOR_AUTH_LOCKOUT=text), "EXECUTOR_AUTH_LOCKOUT", text)


@pytest.mark.parametrize(
    "text",
    [
        "chf:100",
        "CHF:0",
        "CHF:100,CHF:200",
        "CHF:lots",
        "CHF",
        "CHF:100, EUR:200",
        "CHF:100,",
        "SWISS:100",
        f"CHF:{MAX_SAFE_INTEGER + 1}",
        "CHF:-100",
        "CHF:1.5",
        "CHF:\u0665",
        "CHF:100\n",
        "ABC:100",  # three capitals, but ISO 4217 lists no such currency
        "EUR:100,XYZ:5",
    ],
)
def test_ceiling_refusals(text: str) -> None:
    refused(
        legacy_env(EXECUTOR_HARD_LIMIT_SINGLE_MINOR=text), "EXECUTOR_HARD_LIMIT_SINGLE_MINOR", text
    )


def test_ceiling_window_seconds_required_with_count() -> None:
    refused(legacy_env(EXECUTOR_HARD_LIMIT_WINDOW_COUNT="10"), "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS")


def test_ceiling_window_seconds_required_with_sum() -> None:
    refused(
        legacy_env(EXECUTOR_HARD_LIMIT_WINDOW_SUM_MINOR="123456"),
        "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
        "123456",
    )


def test_ceiling_window_seconds_alone_bounds_nothing() -> None:
    refused(
        legacy_env(EXECUTOR_HARD_LIMIT_WINDOW_SECONDS="3600"),
        "EXECUTOR_HARD_LIMIT_WINDOW_SECONDS",
        "3600",
    )


@pytest.mark.parametrize(
    "text",
    [
        _pin("only-one"),
        f"{_pin('a')},{_pin('a')}",
        f"sha1/{_pin('a')[7:]},{_pin('b')}",
        f"{_pin('a')},sha256/not*base64!!",
        "sha256/" + base64.b64encode(b"\x01" * 31).decode() + "," + _pin("b"),
        f"{_pin('a')};{_pin('b')}",
    ],
)
def test_pin_refusals(text: str) -> None:
    refused(legacy_env(DOWNSTREAM_SPKI_PINS=text), "DOWNSTREAM_SPKI_PINS", text)


# --------------------------------------------------------------------------------------------
# URLs


def test_https_downstream_and_endpoint() -> None:
    config = load_config(
        legacy_env(DOWNSTREAM_URL="https://provider.example:8443/v1/payouts?mode=fast")
    )
    assert config.downstream_endpoint == "POST /v1/payouts"
    assert config.downstream_target() == DownstreamTarget(
        system="synthetic-provider", operation="create_payout", endpoint="POST /v1/payouts"
    )
    bare = load_config(legacy_env(DOWNSTREAM_URL="https://provider.example"))
    assert bare.downstream_endpoint == "POST /"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/payouts", "http://[::1]:8080/payouts"])
def test_plain_http_to_loopback_needs_the_flag(url: str) -> None:
    refused(legacy_env(DOWNSTREAM_URL=url), "DOWNSTREAM_URL", url)
    config = load_config(legacy_env(DOWNSTREAM_URL=url, DOWNSTREAM_ALLOW_INSECURE_LOOPBACK="true"))
    assert config.downstream_url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://provider.example/payouts",
        "http://localhost:8080/payouts",
        "http://10.0.0.8/payouts",
        "http://127.0.0.1.nip.example/payouts",
    ],
)
def test_plain_http_anywhere_else_is_refused(url: str) -> None:
    refused(
        legacy_env(DOWNSTREAM_URL=url, DOWNSTREAM_ALLOW_INSECURE_LOOPBACK="true"),
        "DOWNSTREAM_URL",
        url,
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://user:hunter2@provider.example/payouts",
        "https://provider.example/payouts#frag",
        "ftp://provider.example/payouts",
        "provider.example/payouts",
        "https://provider.example:99999/payouts",
        "https:///payouts",
        "https://provider.example/pay outs",
    ],
)
def test_malformed_downstream_url(url: str) -> None:
    refused(legacy_env(DOWNSTREAM_URL=url), "DOWNSTREAM_URL", url, "hunter2")


def test_lookup_urls_need_their_placeholder() -> None:
    good = "https://provider.example/v1/payouts/{idempotency_key}"
    config = load_config(legacy_env(DOWNSTREAM_LOOKUP_URL=good))
    assert config.downstream_lookup_url == good
    bad = "https://provider.example/v1/payouts/lookup"
    error = refused(legacy_env(DOWNSTREAM_LOOKUP_URL=bad), "DOWNSTREAM_LOOKUP_URL", bad)
    assert "{idempotency_key}" in error.problem
    in_host = "https://{idempotency_key}.provider.example/v1"
    refused(legacy_env(DOWNSTREAM_LOOKUP_URL=in_host), "DOWNSTREAM_LOOKUP_URL", in_host)


def test_reference_lookup_needs_its_placeholder() -> None:
    good = "https://provider.example/v1/payouts?reference={provider_reference}"
    config = load_config(legacy_env(DOWNSTREAM_LOOKUP_BY_REFERENCE_URL=good))
    assert config.downstream_lookup_by_reference_url == good
    bad = "https://provider.example/v1/payouts/{idempotency_key}"
    error = refused(
        legacy_env(DOWNSTREAM_LOOKUP_BY_REFERENCE_URL=bad),
        "DOWNSTREAM_LOOKUP_BY_REFERENCE_URL",
        bad,
    )
    assert "{provider_reference}" in error.problem


def test_lookup_over_plain_http_follows_the_downstream_rule() -> None:
    url = "http://127.0.0.1:9/v1/payouts/{idempotency_key}"
    refused(legacy_env(DOWNSTREAM_LOOKUP_URL=url), "DOWNSTREAM_LOOKUP_URL", url)
    load_config(legacy_env(DOWNSTREAM_LOOKUP_URL=url, DOWNSTREAM_ALLOW_INSECURE_LOOPBACK="true"))


# --------------------------------------------------------------------------------------------
# Secrets: sources, never values


def test_secret_sources_env_file_absent() -> None:
    env = legacy_env(
        EXECUTOR_CALLER_TOKEN=None,
        EXECUTOR_CALLER_TOKEN_FILE="/run/secrets/caller-token",
    )
    config = load_config(env)
    token = config.secret_source("EXECUTOR_CALLER_TOKEN")
    assert token == SecretSource(
        "EXECUTOR_CALLER_TOKEN", SecretOrigin.FILE, "/run/secrets/caller-token"
    )
    assert token.given
    assert token.variable == "EXECUTOR_CALLER_TOKEN_FILE"
    credential = config.secret_source("DOWNSTREAM_CREDENTIAL")
    assert credential.origin is SecretOrigin.ENV
    assert credential.path is None
    assert credential.variable == "DOWNSTREAM_CREDENTIAL"
    absent = config.secret_source("EXECUTOR_EVIDENCE_SIGNING_KEY")
    assert absent.origin is SecretOrigin.ABSENT
    assert not absent.given
    assert [s.name for s in config.secret_sources()] == list(SECRET_NAMES)
    with pytest.raises(KeyError):
        config.secret_source("EXECUTOR_MODE")


def test_the_config_never_holds_a_secret_value() -> None:
    config = load_config(legacy_env())
    for rendering in (
        repr(config),
        str(config),
        config.model_dump_json(),
        json.dumps(config.public_view()),
    ):
        assert CALLER_TOKEN not in rendering
        assert "downstream-secret-4c1d" not in rendering


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_never_both_value_and_file(name: str) -> None:
    env = legacy_env(**{name: "inline-secret-value-9", name + "_FILE": "/run/secrets/x-file"})
    error = refused(env, name, "inline-secret-value-9", "/run/secrets/x-file")
    assert "never both" in error.problem


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_production_takes_secrets_only_from_files(name: str) -> None:
    env = production_env(**{name: "inline-secret-value-9", name + "_FILE": None})
    error = refused(env, name, "inline-secret-value-9")
    assert f"{name}_FILE" in error.problem


def test_production_needs_a_secrets_dir_for_mounted_files() -> None:
    refused(production_env(EXECUTOR_SECRETS_DIR=None), "EXECUTOR_SECRETS_DIR")


def test_production_needs_an_authority_signing_key() -> None:
    refused(
        production_env(EXECUTOR_AUTHORITY_SIGNING_KEY_FILE=None),
        "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE",
    )


def test_outside_production_the_authority_key_may_be_ephemeral() -> None:
    config = load_config(legacy_env())
    assert not config.executor_authority_signing_key.given


def test_secret_file_path_with_control_characters() -> None:
    refused(
        legacy_env(EXECUTOR_TLS_KEY_FILE="/run/secrets/\x07bell-path"),
        "EXECUTOR_TLS_KEY_FILE",
        "bell-path",
    )


# --------------------------------------------------------------------------------------------
# Production


def test_valid_production_configuration() -> None:
    config = load_config(production_env())
    assert config.production
    assert not config.legacy_mode
    assert config.executor_posture is PostureMode.ENFORCED


@pytest.mark.parametrize("value", ["production", "PRODUCTION", "Production"])
def test_production_switch(value: str) -> None:
    assert is_production({"AGENTSAFE_ENV": value})
    assert load_config(production_env(AGENTSAFE_ENV=value)).production


@pytest.mark.parametrize("value", ["staging", "development", "prod"])
def test_other_environments_are_not_production(value: str) -> None:
    assert not is_production({"AGENTSAFE_ENV": value})
    assert not load_config(legacy_env(AGENTSAFE_ENV=value)).production


def test_production_refuses_plaintext_listener() -> None:
    refused(
        production_env(
            EXECUTOR_ALLOW_PLAINTEXT_LISTENER="true",
            EXECUTOR_TLS_CERT_FILE=None,
            EXECUTOR_TLS_KEY_FILE=None,
        ),
        "EXECUTOR_ALLOW_PLAINTEXT_LISTENER",
        "true",
    )


def test_production_refuses_waiving_the_journal() -> None:
    refused(production_env(EXECUTOR_JOURNAL_REQUIRED="false"), "EXECUTOR_JOURNAL_REQUIRED", "false")


def test_production_refuses_insecure_loopback() -> None:
    refused(
        production_env(DOWNSTREAM_ALLOW_INSECURE_LOOPBACK="true"),
        "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK",
        "true",
    )


def test_production_refuses_development_posture() -> None:
    refused(production_env(EXECUTOR_POSTURE="DEVELOPMENT"), "EXECUTOR_POSTURE", "DEVELOPMENT")


def _production_legacy(**overrides: str | None) -> dict[str, str]:
    base: dict[str, str | None] = {
        "EXECUTOR_PRINCIPALS_FILE": None,
        "EXECUTOR_TENANT_ID": TENANT,
        "EXECUTOR_ACTOR_ID": "synthetic-payout-agent",
        "EXECUTOR_ACTOR_TYPE": "AI_AGENT",
        "EXECUTOR_CALLER_TOKEN_FILE": "/var/run/agent-safe/secrets/caller-token",
    }
    return production_env(**{**base, **overrides})


def test_production_refuses_legacy_mode() -> None:
    error = refused(_production_legacy(), "EXECUTOR_PRINCIPALS_FILE")
    assert "EXECUTOR_ALLOW_LEGACY_CALLER" in error.problem


def test_production_legacy_mode_by_name() -> None:
    config = load_config(_production_legacy(EXECUTOR_ALLOW_LEGACY_CALLER="true"))
    assert config.legacy_mode
    assert config.production


# --------------------------------------------------------------------------------------------
# Callers


def _principals_env(**overrides: str | None) -> dict[str, str]:
    base: dict[str, str | None] = {
        "EXECUTOR_PRINCIPALS_FILE": "/etc/agentsafe/principals.json",
        "EXECUTOR_TENANT_ID": None,
        "EXECUTOR_ACTOR_ID": None,
        "EXECUTOR_ACTOR_TYPE": None,
        "EXECUTOR_CALLER_TOKEN": None,
    }
    return legacy_env(**{**base, **overrides})


def test_principals_mode() -> None:
    config = load_config(_principals_env())
    assert not config.legacy_mode
    assert config.legacy_actor is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EXECUTOR_TENANT_ID", TENANT),
        ("EXECUTOR_ACTOR_ID", "stray-actor-id"),
        ("EXECUTOR_ACTOR_TYPE", "STRAY_TYPE"),
        ("EXECUTOR_ACTOR_RUNTIME", "stray-runtime"),
        ("EXECUTOR_CALLER_TOKEN", CALLER_TOKEN),
        ("EXECUTOR_CALLER_TOKEN_FILE", "/run/secrets/stray-token"),
    ],
)
def test_principals_file_excludes_legacy_variables(variable: str, value: str) -> None:
    error = refused(_principals_env(**{variable: value}), variable, value)
    assert "EXECUTOR_PRINCIPALS_FILE" in error.problem


@pytest.mark.parametrize(
    "variable",
    ["EXECUTOR_TENANT_ID", "EXECUTOR_ACTOR_ID", "EXECUTOR_ACTOR_TYPE", "EXECUTOR_CALLER_TOKEN"],
)
def test_legacy_mode_needs_its_variables(variable: str) -> None:
    error = refused(legacy_env(**{variable: None}), variable)
    assert "legacy" in error.problem


def test_jwt_audience_needs_jwks_file() -> None:
    refused(
        _principals_env(EXECUTOR_JWT_AUDIENCE="agentsafe-executor"),
        "EXECUTOR_JWKS_FILE",
        "agentsafe-executor",
    )


def test_jwks_file_needs_jwt_audience() -> None:
    refused(
        _principals_env(EXECUTOR_JWKS_FILE="/etc/agentsafe/jwks.json"),
        "EXECUTOR_JWT_AUDIENCE",
        "/etc/agentsafe/jwks.json",
    )


def test_jwks_url_needs_the_file() -> None:
    url = "https://kubernetes.example/openid/v1/jwks"
    refused(_principals_env(EXECUTOR_JWKS_URL=url), "EXECUTOR_JWKS_URL", url)


def test_jwks_url_must_be_https() -> None:
    url = "http://127.0.0.1:6443/openid/v1/jwks"
    refused(
        _principals_env(
            EXECUTOR_JWT_AUDIENCE="agentsafe-executor",
            EXECUTOR_JWKS_FILE="/etc/agentsafe/jwks.json",
            EXECUTOR_JWKS_URL=url,
        ),
        "EXECUTOR_JWKS_URL",
        url,
    )


def test_jwks_ca_file_needs_the_url() -> None:
    refused(
        _principals_env(
            EXECUTOR_JWT_AUDIENCE="agentsafe-executor",
            EXECUTOR_JWKS_FILE="/etc/agentsafe/jwks.json",
            EXECUTOR_JWKS_CA_FILE="/etc/agentsafe/jwks-ca.pem",
        ),
        "EXECUTOR_JWKS_CA_FILE",
        "/etc/agentsafe/jwks-ca.pem",
    )


def test_workload_configuration() -> None:
    config = load_config(
        _principals_env(
            EXECUTOR_JWT_AUDIENCE="agentsafe-executor",
            EXECUTOR_JWKS_FILE="/etc/agentsafe/jwks.json",
            EXECUTOR_JWKS_URL="https://kubernetes.example/openid/v1/jwks",
            EXECUTOR_JWKS_CA_FILE="/etc/agentsafe/jwks-ca.pem",
        )
    )
    assert config.executor_jwt_audience == "agentsafe-executor"
    assert config.executor_jwks_file == Path("/etc/agentsafe/jwks.json")


def test_escalation_refused_in_shadow() -> None:
    refused(
        _principals_env(EXECUTOR_MODE="SHADOW", EXECUTOR_ESCALATION="APPROVAL"),
        "EXECUTOR_ESCALATION",
        "APPROVAL",
    )


def test_approvals_need_principals() -> None:
    refused(legacy_env(EXECUTOR_ESCALATION="APPROVAL"), "EXECUTOR_ESCALATION", "APPROVAL")


def test_approvals_in_enforcement() -> None:
    config = load_config(_principals_env(EXECUTOR_ESCALATION="APPROVAL"))
    assert config.executor_escalation is EscalationMode.APPROVAL


# --------------------------------------------------------------------------------------------
# Listener, journal, evidence


def test_tls_needs_the_certificate() -> None:
    refused(
        legacy_env(
            EXECUTOR_ALLOW_PLAINTEXT_LISTENER=None, EXECUTOR_TLS_KEY_FILE="/run/secrets/tls.key"
        ),
        "EXECUTOR_TLS_CERT_FILE",
    )


def test_tls_needs_the_key() -> None:
    refused(
        legacy_env(
            EXECUTOR_ALLOW_PLAINTEXT_LISTENER=None, EXECUTOR_TLS_CERT_FILE="/etc/tls/tls.crt"
        ),
        "EXECUTOR_TLS_KEY",
    )


def test_tls_listener() -> None:
    config = load_config(
        legacy_env(
            EXECUTOR_ALLOW_PLAINTEXT_LISTENER=None,
            EXECUTOR_TLS_CERT_FILE="/etc/tls/tls.crt",
            EXECUTOR_TLS_KEY_FILE="/run/secrets/tls.key",
            EXECUTOR_TLS_CLIENT_CA_FILE="/etc/tls/clients.pem",
        )
    )
    assert config.executor_allow_plaintext_listener is False
    assert config.executor_tls_key.origin is SecretOrigin.FILE


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EXECUTOR_TLS_CERT_FILE", "/etc/tls/tls.crt"),
        ("EXECUTOR_TLS_KEY_FILE", "/run/secrets/tls.key"),
        ("EXECUTOR_TLS_CLIENT_CA_FILE", "/etc/tls/clients.pem"),
    ],
)
def test_plaintext_listener_excludes_tls_material(variable: str, value: str) -> None:
    refused(legacy_env(**{variable: value}), variable, value)


def test_enforcement_needs_a_journal() -> None:
    refused(legacy_env(EXECUTOR_JOURNAL_DIR=None), "EXECUTOR_JOURNAL_DIR")


def test_journal_may_be_waived_outside_production() -> None:
    config = load_config(legacy_env(EXECUTOR_JOURNAL_DIR=None, EXECUTOR_JOURNAL_REQUIRED="false"))
    assert config.executor_journal_dir is None


def test_shadow_needs_no_journal() -> None:
    config = load_config(legacy_env(EXECUTOR_MODE="SHADOW", EXECUTOR_JOURNAL_DIR=None))
    assert config.executor_mode is ExecutorMode.SHADOW
    assert config.executor_journal_dir is None


@pytest.mark.parametrize("mode", ["SHADOW", "ENFORCEMENT"])
def test_the_state_dir_is_required_without_a_shared_store(mode: str) -> None:
    error = refused(legacy_env(EXECUTOR_MODE=mode, EXECUTOR_STATE_DIR=None), "EXECUTOR_STATE_DIR")
    assert error.problem == "is required without EXECUTOR_STORE_URL"
    shared = load_config(
        legacy_env(
            EXECUTOR_MODE=mode,
            EXECUTOR_STATE_DIR=None,
            EXECUTOR_STORE_URL_FILE="/run/secrets/store-url",
        )
    )
    assert shared.executor_state_dir is None
    assert shared.executor_store_url.given


def test_replica_id_and_lease() -> None:
    config = load_config(legacy_env())
    assert config.executor_attempt_lease_seconds == 30
    assert config.replica_id == os.uname().nodename
    named = load_config(legacy_env(EXECUTOR_REPLICA_ID="executor-7d9f-abcde"))
    assert named.replica_id == "executor-7d9f-abcde"
    refused(legacy_env(EXECUTOR_REPLICA_ID="a b"), "EXECUTOR_REPLICA_ID")
    refused(legacy_env(EXECUTOR_ATTEMPT_LEASE_SECONDS="1"), "EXECUTOR_ATTEMPT_LEASE_SECONDS")


def test_a_shared_store_lease_must_outlive_a_send_between_two_renewals() -> None:
    """Issue 29: with a shared store, two thirds of the lease (what is left between renewals)
    must cover the dispatch deadline plus the margin, or start refuses, saying what to change."""
    url = "postgresql://agentsafe@db/agentsafe"
    with pytest.raises(ConfigError) as caught:
        load_config(
            legacy_env(
                EXECUTOR_STORE_URL=url,
                EXECUTOR_ATTEMPT_LEASE_SECONDS="5",
                DOWNSTREAM_TIMEOUT_MS="5000",
            )
        )
    error = caught.value
    assert error.variable == "EXECUTOR_ATTEMPT_LEASE_SECONDS"
    assert error.code == "ATTEMPT_LEASE_TOO_SHORT"
    assert error.exit_status == 78
    assert "DOWNSTREAM_TIMEOUT_MS" in error.problem
    assert "= 9" in error.problem
    assert url not in str(error)
    # 1.5 x (2 + 1) = 4.5 <= 5: accepted; without a shared store the lease bounds nothing.
    fits = legacy_env(
        EXECUTOR_STORE_URL=url, EXECUTOR_ATTEMPT_LEASE_SECONDS="5", DOWNSTREAM_TIMEOUT_MS="2000"
    )
    assert load_config(fits).executor_attempt_lease_seconds == 5
    alone = legacy_env(EXECUTOR_ATTEMPT_LEASE_SECONDS="5", DOWNSTREAM_TIMEOUT_MS="5000")
    assert load_config(alone).executor_attempt_lease_seconds == 5
    # the defaults (30 s, 10 s) and the largest dispatch deadline (15 s) fit
    assert load_config(legacy_env(EXECUTOR_STORE_URL=url)).executor_attempt_lease_seconds == 30
    largest = legacy_env(EXECUTOR_STORE_URL=url, DOWNSTREAM_TIMEOUT_MS="15000")
    assert load_config(largest).downstream_timeout_ms == 15000


def test_production_takes_the_store_url_only_from_a_file() -> None:
    error = refused(
        production_env(EXECUTOR_STORE_URL="postgresql://agentsafe@db/agentsafe"),
        "EXECUTOR_STORE_URL",
    )
    assert "EXECUTOR_STORE_URL_FILE" in error.problem
    assert "postgresql" not in str(error)
    config = load_config(
        production_env(
            EXECUTOR_STATE_DIR=None,
            EXECUTOR_STORE_URL_FILE="/var/run/agent-safe/secrets/store-url",
        )
    )
    assert config.executor_store_url.given


def test_evidence_signing_key_needs_the_evidence_dir() -> None:
    refused(
        legacy_env(EXECUTOR_EVIDENCE_SIGNING_KEY_FILE="/run/secrets/evidence.pem"),
        "EXECUTOR_EVIDENCE_SIGNING_KEY_FILE",
        "/run/secrets/evidence.pem",
    )
    refused(
        legacy_env(EXECUTOR_EVIDENCE_SIGNING_KEY="inline-evidence-key"),
        "EXECUTOR_EVIDENCE_SIGNING_KEY",
        "inline-evidence-key",
    )
    config = load_config(
        legacy_env(
            EXECUTOR_EVIDENCE_SIGNING_KEY_FILE="/run/secrets/evidence.pem",
            EXECUTOR_EVIDENCE_DIR="/var/lib/agentsafe/evidence",
        )
    )
    assert config.executor_evidence_signing_key.given


# --------------------------------------------------------------------------------------------
# Downstream credential kinds


def _jwt_env(**overrides: str | None) -> dict[str, str]:
    base: dict[str, str | None] = {
        "DOWNSTREAM_CREDENTIAL_KIND": "PRIVATE_KEY_JWT",
        "DOWNSTREAM_CREDENTIAL": None,
        "DOWNSTREAM_CREDENTIAL_HEADER": None,
        "DOWNSTREAM_TOKEN_URL": "https://auth.provider.example/oauth2/token",
        "DOWNSTREAM_CLIENT_ID": "executor-client",
        "DOWNSTREAM_PRIVATE_KEY_FILE": "/run/secrets/client.pem",
    }
    return legacy_env(**{**base, **overrides})


def _signed_env(**overrides: str | None) -> dict[str, str]:
    base: dict[str, str | None] = {
        "DOWNSTREAM_CREDENTIAL_KIND": "SIGNED_REQUEST",
        "DOWNSTREAM_CREDENTIAL": None,
        "DOWNSTREAM_CREDENTIAL_HEADER": None,
        "DOWNSTREAM_SIGNING_KEY_FILE": "/run/secrets/signing.pem",
        "DOWNSTREAM_SIGNING_KEY_ID": "executor-2026",
    }
    return legacy_env(**{**base, **overrides})


def test_private_key_jwt_configuration() -> None:
    config = load_config(_jwt_env())
    assert config.downstream_credential_kind is CredentialKind.PRIVATE_KEY_JWT
    assert config.downstream_private_key_algorithm is PrivateKeyAlgorithm.ES256
    assert config.downstream_signing_algorithm is None
    ps = load_config(_jwt_env(DOWNSTREAM_PRIVATE_KEY_ALGORITHM="PS256"))
    assert ps.downstream_private_key_algorithm is PrivateKeyAlgorithm.PS256


def test_signed_request_configuration() -> None:
    config = load_config(_signed_env())
    assert config.downstream_signing_algorithm is SigningAlgorithm.ED25519
    assert config.downstream_private_key_algorithm is None
    hmac = load_config(_signed_env(DOWNSTREAM_SIGNING_ALGORITHM="hmac-sha256"))
    assert hmac.downstream_signing_algorithm is SigningAlgorithm.HMAC_SHA256


@pytest.mark.parametrize("variable", ["DOWNSTREAM_CREDENTIAL_HEADER", "DOWNSTREAM_CREDENTIAL"])
def test_static_header_needs_its_keys(variable: str) -> None:
    refused(legacy_env(**{variable: None}), variable)


@pytest.mark.parametrize(
    "variable", ["DOWNSTREAM_TOKEN_URL", "DOWNSTREAM_CLIENT_ID", "DOWNSTREAM_PRIVATE_KEY"]
)
def test_private_key_jwt_needs_its_keys(variable: str) -> None:
    overrides: dict[str, str | None] = {variable: None}
    if variable == "DOWNSTREAM_PRIVATE_KEY":
        overrides["DOWNSTREAM_PRIVATE_KEY_FILE"] = None
    refused(_jwt_env(**overrides), variable)


@pytest.mark.parametrize("variable", ["DOWNSTREAM_SIGNING_KEY", "DOWNSTREAM_SIGNING_KEY_ID"])
def test_signed_request_needs_its_keys(variable: str) -> None:
    overrides: dict[str, str | None] = {variable: None}
    if variable == "DOWNSTREAM_SIGNING_KEY":
        overrides["DOWNSTREAM_SIGNING_KEY_FILE"] = None
    refused(_signed_env(**overrides), variable)


FOREIGN_KEYS = [
    ("STATIC_HEADER", "DOWNSTREAM_TOKEN_URL", "https://auth.provider.example/token"),
    ("STATIC_HEADER", "DOWNSTREAM_CLIENT_ID", "stray-client"),
    ("STATIC_HEADER", "DOWNSTREAM_PRIVATE_KEY_FILE", "/run/secrets/stray.pem"),
    ("STATIC_HEADER", "DOWNSTREAM_PRIVATE_KEY_ALGORITHM", "PS256"),
    ("STATIC_HEADER", "DOWNSTREAM_TOKEN_SCOPE", "payouts:write"),
    ("STATIC_HEADER", "DOWNSTREAM_SIGNING_KEY_ID", "stray-key-id"),
    ("STATIC_HEADER", "DOWNSTREAM_SIGNING_ALGORITHM", "hmac-sha256"),
    ("PRIVATE_KEY_JWT", "DOWNSTREAM_CREDENTIAL_HEADER", "x-api-key"),
    ("PRIVATE_KEY_JWT", "DOWNSTREAM_CREDENTIAL", "stray-static-secret"),
    ("PRIVATE_KEY_JWT", "DOWNSTREAM_SIGNING_KEY", "stray-signing-secret"),
    ("SIGNED_REQUEST", "DOWNSTREAM_CREDENTIAL_FILE", "/run/secrets/stray-static"),
    ("SIGNED_REQUEST", "DOWNSTREAM_TOKEN_AUDIENCE", "https://auth.provider.example"),
    ("SIGNED_REQUEST", "DOWNSTREAM_PRIVATE_KEY_ID", "stray-kid"),
]


@pytest.mark.parametrize(("kind", "variable", "value"), FOREIGN_KEYS)
def test_other_kinds_keys_must_be_absent(kind: str, variable: str, value: str) -> None:
    env = {"STATIC_HEADER": legacy_env, "PRIVATE_KEY_JWT": _jwt_env, "SIGNED_REQUEST": _signed_env}[
        kind
    ](**{variable: value})
    error = refused(env, variable, value)
    assert "DOWNSTREAM_CREDENTIAL_KIND" in error.problem


@pytest.mark.parametrize(
    "header",
    [
        "Idempotency-Key",
        "x-agent-safe-intent-hash",
        "X-Agent-Safe-Other",
        "Host",
        "Upgrade",
        "Signature",
        "content-digest",
        "bad header",
        "a:b",
    ],
)
def test_credential_header_must_be_a_free_header_name(header: str) -> None:
    refused(legacy_env(DOWNSTREAM_CREDENTIAL_HEADER=header), "DOWNSTREAM_CREDENTIAL_HEADER", header)


def test_token_url_follows_the_downstream_scheme_rule() -> None:
    url = "http://127.0.0.1:9/token"
    refused(_jwt_env(DOWNSTREAM_TOKEN_URL=url), "DOWNSTREAM_TOKEN_URL", url)
    load_config(_jwt_env(DOWNSTREAM_TOKEN_URL=url, DOWNSTREAM_ALLOW_INSECURE_LOOPBACK="true"))


# --------------------------------------------------------------------------------------------
# Digest and describe


def test_digest_is_stable_and_tracks_changes() -> None:
    first = load_config(legacy_env()).digest()
    assert first == load_config(legacy_env()).digest()
    assert first.startswith("sha256:")
    assert first != load_config(legacy_env(EXECUTOR_INTENT_TTL_SECONDS="61")).digest()
    # A secret's value is not part of it: rotating the value leaves the digest unchanged.
    assert first == load_config(legacy_env(EXECUTOR_CALLER_TOKEN="another-token")).digest()


def test_describe_sources_and_values() -> None:
    env = legacy_env(
        EXECUTOR_CALLER_TOKEN=None,
        EXECUTOR_CALLER_TOKEN_FILE="/run/secrets/caller-token",
        EXECUTOR_INTENT_TTL_SECONDS="120",
    )
    rows = {row.key: row for row in describe_config(env)}
    assert set(rows) == {
        k
        for k in CONFIG_KEYS
        if not k.endswith("_FILE") or k not in {n + "_FILE" for n in SECRET_NAMES}
    }
    assert rows["EXECUTOR_INTENT_TTL_SECONDS"] == ConfigRow(
        "EXECUTOR_INTENT_TTL_SECONDS", "120", "env"
    )
    assert rows["PORT"] == ConfigRow("PORT", "8443", "default")
    assert rows["EXECUTOR_AUTH_LOCKOUT"] == ConfigRow(
        "EXECUTOR_AUTH_LOCKOUT", "10/60/300", "default"
    )
    assert rows["EXECUTOR_ALLOW_PLAINTEXT_LISTENER"].value == "true"
    assert rows["EXECUTOR_CALLER_TOKEN"] == ConfigRow(
        "EXECUTOR_CALLER_TOKEN", "<set>", "file:/run/secrets/caller-token"
    )
    assert rows["DOWNSTREAM_CREDENTIAL"] == ConfigRow("DOWNSTREAM_CREDENTIAL", "<set>", "env")
    assert rows["EXECUTOR_TLS_KEY"] == ConfigRow("EXECUTOR_TLS_KEY", None, "unset")
    assert rows["EXECUTOR_HALT_FILE"] == ConfigRow("EXECUTOR_HALT_FILE", None, "unset")
    assert rows["EXECUTOR_POLICY_FILE"].value == "/etc/agentsafe/policy.yaml"


def test_describe_never_shows_a_secret_value() -> None:
    env = legacy_env(
        EXECUTOR_EVIDENCE_DIR="/var/lib/agentsafe/evidence",
        EXECUTOR_EVIDENCE_SIGNING_KEY="evidence-key-secret-77",
    )
    rows = describe_config(env)
    secrets = (CALLER_TOKEN, DOWNSTREAM_SECRET, "downstream-secret-4c1d", "evidence-key-secret-77")
    for row in rows:
        for secret in secrets:
            assert secret not in (row.value or "")
            assert secret not in row.source
    text = render_config_table(rows)
    for secret in secrets:
        assert secret not in text
    assert "<set>" in text


def test_describe_refuses_as_load_does() -> None:
    with pytest.raises(ConfigError) as caught:
        describe_config(legacy_env(EXECUTOR_MODE="LOUD"))
    assert caught.value.variable == "EXECUTOR_MODE"


def test_render_prints_to_a_console_and_reads_no_markup() -> None:
    env = legacy_env(DOWNSTREAM_SYSTEM="[bold]ledger[/bold]")
    rows = describe_config(env)
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    text = render_config_table(rows, console=console)
    printed = buffer.getvalue()
    assert "[bold]ledger[/bold]" in text
    assert "[bold]ledger[/bold]" in printed
    assert "DOWNSTREAM_SYSTEM" in printed
    assert "default" in printed


# --------------------------------------------------------------------------------------------
# Issue 21: the approval page's origin and the webhook


def approval_env(**overrides: str | None) -> dict[str, str]:
    base = production_env(EXECUTOR_ESCALATION="APPROVAL")
    return _apply(base, overrides)


def test_the_approval_origin_and_webhook_load() -> None:
    config = load_config(
        approval_env(
            EXECUTOR_APPROVAL_ORIGIN="https://approvals.bank.example:8443/",
            EXECUTOR_APPROVAL_WEBHOOK_URL="https://hooks.bank.example/services/T0/B0/x",
            EXECUTOR_APPROVAL_WEBHOOK_CA_FILE="/etc/agentsafe/hooks-ca.pem",
        )
    )
    assert config.executor_approval_origin == "https://approvals.bank.example:8443"
    assert config.executor_approval_webhook_url == "https://hooks.bank.example/services/T0/B0/x"
    assert config.executor_approval_webhook_allow_insecure_loopback is False


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EXECUTOR_APPROVAL_ORIGIN", "http://approvals.bank.example"),
        ("EXECUTOR_APPROVAL_ORIGIN", "https://approvals.bank.example/approve"),
        ("EXECUTOR_APPROVAL_ORIGIN", "https://user:secret@approvals.bank.example"),
        ("EXECUTOR_APPROVAL_ORIGIN", "https://approvals.bank.example?x=1"),
        ("EXECUTOR_APPROVAL_WEBHOOK_URL", "http://hooks.bank.example/x"),
        ("EXECUTOR_APPROVAL_WEBHOOK_URL", "not a url"),
    ],
)
def test_the_approval_origin_and_webhook_are_https(variable: str, value: str) -> None:
    refused(approval_env(**{variable: value}), variable, "secret")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EXECUTOR_APPROVAL_ORIGIN", "https://approvals.bank.example"),
        ("EXECUTOR_APPROVAL_WEBHOOK_URL", "https://hooks.bank.example/x"),
    ],
)
def test_approval_settings_need_approvals(variable: str, value: str) -> None:
    refused(production_env(**{variable: value}), variable)


def test_webhook_extras_need_the_webhook_and_loopback_is_refused_in_production() -> None:
    refused(
        approval_env(EXECUTOR_APPROVAL_WEBHOOK_CA_FILE="/etc/ca.pem"),
        "EXECUTOR_APPROVAL_WEBHOOK_CA_FILE",
    )
    refused(
        approval_env(
            EXECUTOR_APPROVAL_WEBHOOK_URL="https://hooks.bank.example/x",
            EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK="true",
        ),
        "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK",
    )


# --------------------------------------------------------------------------------------------
# The listener's deadlines and caps, the egress override (issue 16)


def test_listener_limits_have_sane_defaults() -> None:
    config = load_config(legacy_env())
    assert config.executor_header_timeout_seconds == 10
    assert config.executor_body_timeout_seconds == 10
    assert config.executor_max_connections == 1024
    assert config.executor_max_connections_per_source == 128
    assert config.executor_egress_allow_cidrs == ()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EXECUTOR_HEADER_TIMEOUT_SECONDS", "0"),
        ("EXECUTOR_HEADER_TIMEOUT_SECONDS", "301"),
        ("EXECUTOR_BODY_TIMEOUT_SECONDS", "0"),
        ("EXECUTOR_BODY_TIMEOUT_SECONDS", "1.5"),
        ("EXECUTOR_MAX_CONNECTIONS", "0"),
        ("EXECUTOR_MAX_CONNECTIONS_PER_SOURCE", "0"),
    ],
)
def test_listener_limits_out_of_range_are_refused(variable: str, value: str) -> None:
    refused(legacy_env(**{variable: value}), variable)


def test_workers_default_to_one_and_above_one_need_the_journal() -> None:
    assert load_config(legacy_env()).executor_workers == WORKERS_DEFAULT == 1
    assert load_config(legacy_env(EXECUTOR_WORKERS=str(WORKERS_MAX))).executor_workers == 16
    for value in ("two", "1.5", "-1", "0"):
        refused(legacy_env(EXECUTOR_WORKERS=value), "EXECUTOR_WORKERS", value)
    env = legacy_env(
        EXECUTOR_WORKERS="2", EXECUTOR_JOURNAL_DIR=None, EXECUTOR_JOURNAL_REQUIRED="false"
    )
    error = refused(env, "EXECUTOR_WORKERS")
    assert "EXECUTOR_JOURNAL_DIR" in error.problem
    rows = {row.key: row for row in describe_config(legacy_env(EXECUTOR_WORKERS="4"))}
    assert (rows["EXECUTOR_WORKERS"].value, rows["EXECUTOR_WORKERS"].source) == ("4", "env")


def test_a_per_source_cap_above_the_total_is_refused() -> None:
    env = legacy_env(EXECUTOR_MAX_CONNECTIONS="10", EXECUTOR_MAX_CONNECTIONS_PER_SOURCE="11")
    refused(env, "EXECUTOR_MAX_CONNECTIONS_PER_SOURCE")


def test_egress_allow_cidrs_are_parsed_to_canonical_networks() -> None:
    config = load_config(legacy_env(EXECUTOR_EGRESS_ALLOW_CIDRS="10.96.0.0/12,FD00:10::/32"))
    assert config.executor_egress_allow_cidrs == ("10.96.0.0/12", "fd00:10::/32")


@pytest.mark.parametrize(
    "value", ["10.96.0.1/12", "0.0.0.0/0", "::/0", "10.0.0.0/8, 10.1.0.0/16", "x", "10.0.0.0/8,"]
)
def test_egress_allow_cidrs_that_are_not_clear_networks_are_refused(value: str) -> None:
    refused(legacy_env(EXECUTOR_EGRESS_ALLOW_CIDRS=value), "EXECUTOR_EGRESS_ALLOW_CIDRS", value)
