"""The banking family's arithmetic and checks, on their own (no process, no provider)."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.banking.actions import (
    ACTIONS,
    currency_exponent,
    parse_amount,
    prepare_action,
)
from agentsafe.executor.codes import Code
from agentsafe.executor.errors import RequestRejected

DE = "iban:DE89370400440532013000"
FR = "iban:FR1420041010050500013M02606"
GB = "iban:GB82WEST12345698765432"
SEPA = ACTIONS["banking.credit_transfer.sepa"]
CROSS = ACTIONS["banking.credit_transfer.cross_border"]


def sepa(**overrides: Any) -> dict[str, Any]:
    action = {
        "type": "SEPA_CREDIT_TRANSFER",
        "amountMinor": 12500,
        "currency": "EUR",
        "debtor": DE,
        "creditor": FR,
        "creditorName": "Synthetic Supplier SA",
    }
    action.update(overrides)
    return action


def refused(kind: Any, parameters: dict[str, Any]) -> str:
    with pytest.raises(RequestRejected) as caught:
        prepare_action(kind, parameters)
    return str(caught.value.code)


def test_a_sepa_transfer_derives_its_target_transport_action_and_effect() -> None:
    prepared = prepare_action(SEPA, sepa())
    assert prepared.target == FR
    assert prepared.transport_action == "credit_transfer.sepa"
    assert prepared.expected == {
        "type": "SEPA_CREDIT_TRANSFER",
        "amountMinor": 12500,
        "currency": "EUR",
        "exponent": 2,
        "debtor": DE,
        "creditor": FR,
    }
    assert prepared.ceiling == {"amountMinor": 12500, "currency": "EUR"}


def test_exponents_come_from_the_iso4217_package() -> None:
    assert currency_exponent("JPY") == 0
    assert currency_exponent("BHD") == 3
    assert currency_exponent("EUR") == 2
    for code in ("ABC", "XAU", "eur", "EURO", 978):
        with pytest.raises(RequestRejected) as caught:
            currency_exponent(code)
        assert caught.value.code == Code.BANKING_CURRENCY_UNKNOWN


def test_amounts_have_no_two_to_the_53_ceiling() -> None:
    huge = "9" * 40
    assert parse_amount(huge) == int(huge)
    assert parse_amount(2**53 + 1) == 2**53 + 1
    prepared = prepare_action(
        CROSS,
        {
            "type": "CROSS_BORDER_CREDIT_TRANSFER",
            "amountMinor": huge,
            "currency": "JPY",
            "debtor": DE,
            "creditor": GB,
            "creditorName": "Synthetic Ltd",
            "creditorBic": "NWBKGB2L",
        },
    )
    assert prepared.expected["amountMinor"] == int(huge)
    assert prepared.expected["exponent"] == 0
    assert prepared.ceiling == {"amountMinor": int(huge), "currency": "JPY"}
    for bad in (0, -1, True, 1.5, "012", "1e3", "", None):
        with pytest.raises(RequestRejected) as caught:
            parse_amount(bad)
        assert caught.value.code == Code.BANKING_AMOUNT_INVALID


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"creditor": "iban:FR1420041010050500013M02607"}, Code.BANKING_IBAN_INVALID),  # digit
        ({"creditor": "iban:DE8937040044053201300"}, Code.BANKING_IBAN_INVALID),  # length
        ({"creditor": "iban:de89370400440532013000"}, Code.BANKING_IBAN_INVALID),
        ({"creditor": "account:ops-1"}, Code.BANKING_ACTION_INVALID),  # SEPA: IBANs only
        ({"currency": "USD"}, Code.BANKING_CURRENCY_UNKNOWN),  # SEPA is EUR
        ({"currency": "ABC"}, Code.BANKING_CURRENCY_UNKNOWN),
        ({"amountMinor": "12.50"}, Code.BANKING_AMOUNT_INVALID),
        ({"type": "INTERNAL_TRANSFER"}, Code.BANKING_ACTION_INVALID),
        ({"surprise": 1}, Code.BANKING_ACTION_INVALID),
    ],
)
def test_a_malformed_sepa_transfer_is_refused_with_its_own_code(
    overrides: dict[str, Any], code: Code
) -> None:
    assert refused(SEPA, sepa(**overrides)) == code


def test_a_bic_is_checked_by_format_and_country() -> None:
    base = {
        "type": "CROSS_BORDER_CREDIT_TRANSFER",
        "amountMinor": 100,
        "currency": "USD",
        "debtor": DE,
        "creditor": "account:us-vendor-7",
        "creditorName": "Synthetic Inc",
    }
    assert prepare_action(CROSS, {**base, "creditorBic": "CHASUS33XXX"}).target == (
        "account:us-vendor-7"
    )
    for bic in ("CHASXX33", "chasus33", "CHASUS3", "CHAS-S33"):
        assert refused(CROSS, {**base, "creditorBic": bic}) == Code.BANKING_BIC_INVALID


def test_the_other_actions_derive_their_targets_and_move_no_value_when_they_do_not() -> None:
    internal = prepare_action(
        ACTIONS["banking.internal_transfer"],
        {
            "type": "INTERNAL_TRANSFER",
            "amountMinor": 5,
            "currency": "BHD",
            "fromAccount": "account:treasury",
            "toAccount": "account:payroll",
        },
    )
    assert internal.target == "account:payroll"
    assert internal.expected["exponent"] == 3
    beneficiary = prepare_action(
        ACTIONS["banking.beneficiary.create"],
        {"type": "BENEFICIARY_CREATION", "beneficiary": GB, "name": "Synthetic Ltd"},
    )
    assert beneficiary.target == GB
    assert beneficiary.ceiling is None
    cancel = prepare_action(
        ACTIONS["banking.payment.cancel"],
        {"type": "PAYMENT_CANCELLATION", "paymentReference": "bank_0123"},
    )
    assert cancel.target == "payment:bank_0123"
    assert cancel.ceiling is None


def test_every_action_schema_is_strict() -> None:
    from agentsafe.executor.dispatch.seam import check_parameters_schema

    for kind in ACTIONS.values():
        check_parameters_schema(kind.schema)
