"""Canonical banking actions: what each one is, how it is checked, and what it should effect.

An action arrives as the proposal's parameters, a JSON object whose ``type`` names it:

================================  ========================================  =================
``type``                          registered handler                        derived target
================================  ========================================  =================
``SEPA_CREDIT_TRANSFER``          ``banking.credit_transfer.sepa``          ``creditor``
``CROSS_BORDER_CREDIT_TRANSFER``  ``banking.credit_transfer.cross_border``  ``creditor``
``INTERNAL_TRANSFER``             ``banking.internal_transfer``             ``toAccount``
``BENEFICIARY_CREATION``          ``banking.beneficiary.create``            ``beneficiary``
``PAYMENT_CANCELLATION``          ``banking.payment.cancel``                ``payment:<ref>``
================================  ========================================  =================

A SEPA transfer's parties are ``iban:`` references; a cross-border or internal transfer's may
also be ``account:`` ones; a cancellation's target is ``payment:`` + its ``paymentReference``.

The executor derives the transport action (the handler name without ``banking.``) and the target
from the action and never trusts the proposal's: a target that differs is refused before the
authority is asked (422 ACTION_TARGET_MISMATCH, ``effects/adapter.py``).

Rules, each refused with its own 422 code and nothing echoed:

* ``amountMinor`` is a positive integer of minor units at the currency's own ISO 4217 exponent
  (2 for EUR, 0 for JPY, 3 for BHD), given as a JSON integer or, for amounts beyond what a JSON
  number carries exactly (2^53), as a string of decimal digits; Python integers have no ceiling.
  Otherwise BANKING_AMOUNT_INVALID.
* ``currency`` is a code the ``iso4217`` data package lists with a minor unit (XAU and XXX have
  none), else BANKING_CURRENCY_UNKNOWN; a SEPA credit transfer is in EUR.
* an ``iban:`` reference passes schwifty's check digits and country length (BANKING_IBAN_INVALID);
  an ``account:`` reference is a short identifier; a BIC is upper case in the ISO 9362 shape with
  a country schwifty knows (BANKING_BIC_INVALID).

:func:`prepare_action` returns the :class:`~agentsafe.executor.effects.adapter.Prepared` action:
the authorised effect (``type``, ``amountMinor`` as an integer, ``currency``, the parties) and the
projection the host ceilings read (``{"amountMinor", "currency"}``, ``None`` for an action that
moves no value).

Callers: ``banking/transport.py`` (the adapter's ``prepare`` and ``observe_effect``).
Also imported by ``registration.py``, ``tools/harness.py``, ``tools/synthetic_bank.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from iso4217 import Currency
from schwifty import BIC, IBAN
from schwifty.exceptions import SchwiftyException

from ..codes import Code
from ..config import iso4217_listed
from ..effects.adapter import Prepared
from ..errors import RequestRejected

__all__ = [
    "ACTIONS",
    "ActionKind",
    "currency_exponent",
    "parse_amount",
    "prepare_action",
    "projection",
]

_DIGITS = re.compile(r"[1-9][0-9]{0,63}")
_ACCOUNT = re.compile(r"account:[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_BIC = re.compile(r"[A-Z]{4}[A-Z]{2}[A-Z0-9]{2}(?:[A-Z0-9]{3})?")
_PAYMENT_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_TEXT = {"type": "string", "minLength": 1, "maxLength": 140}
_AMOUNT = {
    "anyOf": [
        {"type": "integer", "minimum": 1},
        {"type": "string", "pattern": "^[1-9][0-9]{0,63}$"},
    ]
}
_REF = {"type": "string", "minLength": 1, "maxLength": 80}
_CURRENCY = {"type": "string", "pattern": "^[A-Z]{3}$"}


@dataclass(frozen=True)
class ActionKind:
    """One canonical banking action type."""

    type: str
    handler: str
    properties: Mapping[str, Any]
    required: tuple[str, ...]
    target_field: str
    moves_value: bool
    party_fields: tuple[str, ...]

    @property
    def transport_action(self) -> str:
        return self.handler.removeprefix("banking.")

    @property
    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["type", *self.required],
            "properties": {"type": {"const": self.type}, **self.properties},
        }


def _transfer(type_: str, handler: str, *, bic: bool) -> ActionKind:
    properties: dict[str, Any] = {
        "amountMinor": _AMOUNT,
        "currency": _CURRENCY,
        "debtor": _REF,
        "creditor": _REF,
        "creditorName": _TEXT,
        "remittance": _TEXT,
    }
    required: tuple[str, ...] = ("amountMinor", "currency", "debtor", "creditor", "creditorName")
    if bic:
        properties["creditorBic"] = {"type": "string", "pattern": "^[A-Z0-9]{8}([A-Z0-9]{3})?$"}
        required = (*required, "creditorBic")
    return ActionKind(
        type=type_,
        handler=handler,
        properties=properties,
        required=required,
        target_field="creditor",
        moves_value=True,
        party_fields=("debtor", "creditor"),
    )


ACTIONS: dict[str, ActionKind] = {
    kind.handler: kind
    for kind in (
        _transfer("SEPA_CREDIT_TRANSFER", "banking.credit_transfer.sepa", bic=False),
        _transfer("CROSS_BORDER_CREDIT_TRANSFER", "banking.credit_transfer.cross_border", bic=True),
        ActionKind(
            type="INTERNAL_TRANSFER",
            handler="banking.internal_transfer",
            properties={
                "amountMinor": _AMOUNT,
                "currency": _CURRENCY,
                "fromAccount": _REF,
                "toAccount": _REF,
                "remittance": _TEXT,
            },
            required=("amountMinor", "currency", "fromAccount", "toAccount"),
            target_field="toAccount",
            moves_value=True,
            party_fields=("fromAccount", "toAccount"),
        ),
        ActionKind(
            type="BENEFICIARY_CREATION",
            handler="banking.beneficiary.create",
            properties={
                "beneficiary": _REF,
                "name": _TEXT,
                "bic": {"type": "string", "pattern": "^[A-Z0-9]{8}([A-Z0-9]{3})?$"},
            },
            required=("beneficiary", "name"),
            target_field="beneficiary",
            moves_value=False,
            party_fields=("beneficiary",),
        ),
        ActionKind(
            type="PAYMENT_CANCELLATION",
            handler="banking.payment.cancel",
            properties={"paymentReference": _REF, "reason": _TEXT},
            required=("paymentReference",),
            target_field="paymentReference",
            moves_value=False,
            party_fields=("paymentReference",),
        ),
    )
}
"""Every action this build mirrors, by registered handler name."""


def _refuse(code: Code, message: str) -> RequestRejected:
    return RequestRejected(code, message)


def currency_exponent(code: object) -> int:
    """The ISO 4217 minor-unit exponent of ``code``; refused when the package does not list it
    or lists it without minor units."""
    if not iso4217_listed(code):
        raise _refuse(Code.BANKING_CURRENCY_UNKNOWN, "ISO 4217 does not list this currency")
    exponent = Currency(str(code)).exponent
    if exponent is None:
        raise _refuse(Code.BANKING_CURRENCY_UNKNOWN, "this ISO 4217 code has no minor unit")
    return int(exponent)


def parse_amount(value: object) -> int:
    """A positive integer of minor units from a JSON integer or a string of digits."""
    if isinstance(value, bool):
        raise _refuse(Code.BANKING_AMOUNT_INVALID, "amountMinor is not an integer")
    if isinstance(value, int):
        if value < 1:
            raise _refuse(Code.BANKING_AMOUNT_INVALID, "amountMinor must be positive")
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    raise _refuse(Code.BANKING_AMOUNT_INVALID, "amountMinor is not an integer of minor units")


def _party(value: object, *, allow_account: bool) -> str:
    """An ``iban:`` reference (check digits and country length), or an ``account:`` one."""
    if isinstance(value, str) and value.startswith("iban:"):
        text = value.removeprefix("iban:")
        if not re.fullmatch(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{1,30}", text):
            raise _refuse(Code.BANKING_IBAN_INVALID, "an IBAN is upper case without spaces")
        try:
            IBAN(text)
        except SchwiftyException:
            raise _refuse(
                Code.BANKING_IBAN_INVALID, "an IBAN fails its check digits or its length"
            ) from None
        return value
    if allow_account and isinstance(value, str) and _ACCOUNT.fullmatch(value):
        return value
    raise _refuse(
        Code.BANKING_ACTION_INVALID,
        "a party is an iban: reference" + (" or an account: reference" if allow_account else ""),
    )


def _bic(value: object) -> str:
    if not isinstance(value, str) or not _BIC.fullmatch(value):
        raise _refuse(Code.BANKING_BIC_INVALID, "a BIC is 8 or 11 upper-case characters")
    try:
        BIC(value)
    except SchwiftyException:
        raise _refuse(Code.BANKING_BIC_INVALID, "a BIC names no known country") from None
    return value


def prepare_action(kind: ActionKind, parameters: Mapping[str, Any]) -> Prepared:
    """Check ``parameters`` as an action of ``kind`` and derive what it should effect."""
    if parameters.get("type") != kind.type:
        raise _refuse(
            Code.BANKING_ACTION_INVALID, "the action's type is not the one this handler runs"
        )
    missing = [name for name in ("type", *kind.required) if name not in parameters]
    unknown = [name for name in parameters if name != "type" and name not in kind.properties]
    if missing or unknown:
        raise _refuse(
            Code.BANKING_ACTION_INVALID, "the action's fields are not its canonical fields"
        )
    expected: dict[str, Any] = {"type": kind.type}
    ceiling: dict[str, Any] | None = None
    if kind.moves_value:
        exponent = currency_exponent(parameters["currency"])
        amount = parse_amount(parameters["amountMinor"])
        if kind.type == "SEPA_CREDIT_TRANSFER" and parameters["currency"] != "EUR":
            raise _refuse(Code.BANKING_CURRENCY_UNKNOWN, "a SEPA credit transfer is in EUR")
        expected.update(amountMinor=amount, currency=parameters["currency"], exponent=exponent)
        ceiling = {"amountMinor": amount, "currency": parameters["currency"]}
    if kind.type == "SEPA_CREDIT_TRANSFER":
        for name in kind.party_fields:
            expected[name] = _party(parameters[name], allow_account=False)
    elif kind.type in ("CROSS_BORDER_CREDIT_TRANSFER", "INTERNAL_TRANSFER"):
        for name in kind.party_fields:
            expected[name] = _party(parameters[name], allow_account=True)
    elif kind.type == "BENEFICIARY_CREATION":
        expected["beneficiary"] = _party(parameters["beneficiary"], allow_account=False)
    else:
        reference = parameters["paymentReference"]
        if not isinstance(reference, str) or not _PAYMENT_REFERENCE.fullmatch(reference):
            raise _refuse(Code.BANKING_ACTION_INVALID, "a payment reference is an identifier")
        expected["paymentReference"] = reference
    for name in ("creditorBic", "bic"):
        if name in parameters:
            expected[name] = _bic(parameters[name])
    target_value = parameters[kind.target_field]
    target = f"payment:{target_value}" if kind.type == "PAYMENT_CANCELLATION" else target_value
    return Prepared(
        transport_action=kind.transport_action,
        target=str(target),
        expected=expected,
        ceiling=ceiling,
    )


def projection(kind: ActionKind, reported: Mapping[str, Any]) -> dict[str, Any]:
    """The provider's account in the same projection as the authorised effect: the fields it
    stated, the amount as an integer (``None`` when it is not one), nothing else."""
    observed: dict[str, Any] = {}
    fields = ("type", "amountMinor", "currency", "exponent", *kind.party_fields)
    for name in (*fields, "creditorBic", "bic", "paymentReference"):
        if name not in reported:
            continue
        value = reported[name]
        if name == "amountMinor":
            try:
                value = parse_amount(value)
            except RequestRejected:
                value = None
        observed[name] = value
    if kind.moves_value and "exponent" not in observed and "currency" in observed:
        try:
            observed["exponent"] = currency_exponent(observed["currency"])
        except RequestRejected:
            observed["exponent"] = None
    return observed
