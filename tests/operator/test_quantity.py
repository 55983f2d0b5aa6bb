"""Kubernetes resource quantities in ``spec.pod.resources`` (issue 31, item 15).

The cases are apimachinery's own (``k8s.io/apimachinery/pkg/api/resource/quantity_test.go``,
``TestQuantityParse``: its table of valid inputs, each also with an explicit ``+``, and its list of
invalid ones), so the model, the generated CRD's pattern and the render's reading of a quantity
agree with what a Deployment takes. One deliberate difference: a negative quantity parses there,
but a pod's validation refuses it, so it is refused here at once.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pydantic
import pytest

from agentsafe.operator.crds import generate_crds
from agentsafe.operator.models import ResourceRequirementsSpec
from agentsafe.operator.render.workload import quantity

# TestQuantityParse's table (inputs only), with the value each means.
APIMACHINERY_VALID: dict[str, Decimal] = {
    "0": Decimal(0),
    "0n": Decimal(0),
    "0u": Decimal(0),
    "0m": Decimal(0),
    "0Ki": Decimal(0),
    "0k": Decimal(0),
    "0Mi": Decimal(0),
    "0M": Decimal(0),
    "0Gi": Decimal(0),
    "0G": Decimal(0),
    "0Ti": Decimal(0),
    "0T": Decimal(0),
    "1": Decimal(1),
    "1Ki": Decimal(1024),
    "8Ki": Decimal(8 * 1024),
    "7Mi": Decimal(7 * 2**20),
    "6Gi": Decimal(6 * 2**30),
    "5Ti": Decimal(5 * 2**40),
    "4Pi": Decimal(4 * 2**50),
    "3Ei": Decimal(3 * 2**60),
    "10Ti": Decimal(10 * 2**40),
    "100Ti": Decimal(100 * 2**40),
    "5n": Decimal("5e-9"),
    "4u": Decimal("4e-6"),
    "3m": Decimal("3e-3"),
    "9": Decimal(9),
    "8k": Decimal(8000),
    "50k": Decimal(50000),
    "7M": Decimal("7e6"),
    "6G": Decimal("6e9"),
    "5T": Decimal("5e12"),
    "40T": Decimal("4e13"),
    "300T": Decimal("3e14"),
    "2P": Decimal("2e15"),
    "1E": Decimal("1e18"),
    "1E-3": Decimal("1e-3"),
    "1e3": Decimal(1000),
    "1E6": Decimal("1e6"),
    "1e9": Decimal("1e9"),
    "1E12": Decimal("1e12"),
    "1e15": Decimal("1e15"),
    "1E18": Decimal("1e18"),
    "1e14": Decimal("1e14"),
    "1e13": Decimal("1e13"),
    "100.035k": Decimal(100035),
    "0.001": Decimal("0.001"),
    "0.0005k": Decimal("0.5"),
    "0.005": Decimal("0.005"),
    "0.05": Decimal("0.05"),
    "0.5": Decimal("0.5"),
    "0.00050k": Decimal("0.5"),
    "0.00500": Decimal("0.005"),
    "0.05000": Decimal("0.05"),
    "0.50000": Decimal("0.5"),
    "0.5e0": Decimal("0.5"),
    "0.5e-1": Decimal("0.05"),
    "0.5e-2": Decimal("0.005"),
    "10.035M": Decimal("10035e3"),
    "1.2e3": Decimal(1200),
    "1.3E+6": Decimal("1.3e6"),
    "1.40e9": Decimal("1.4e9"),
    "1.53E12": Decimal("1.53e12"),
    "1.6e15": Decimal("1.6e15"),
    "1.7E18": Decimal("1.7e18"),
    "9.01": Decimal("9.01"),
    "8.1k": Decimal(8100),
    "7.123456M": Decimal(7123456),
    "6.987654321G": Decimal(6987654321),
    "5.444T": Decimal("5.444e12"),
    "40.1T": Decimal("4.01e13"),
    "300.2T": Decimal("3.002e14"),
    "2.5P": Decimal("2.5e15"),
    "1.01E": Decimal("1.01e18"),
    # Kubernetes rounds these up to a nanounit when it stores them; read exactly here.
    "3.001n": Decimal("3.001e-9"),
    "1.1E-9": Decimal("1.1e-9"),
    "0.0000000001": Decimal("1e-10"),
    "0.5e-9": Decimal("5e-10"),
    "0.9n": Decimal("9e-10"),
    "9Ei": Decimal(9 * 2**60),
    "12E": Decimal("12e18"),
    "100.035Ki": Decimal("100.035") * 1024,
    "0.5Mi": Decimal(2**19),
    "0.05Gi": Decimal("0.05") * 2**30,
    "0.025Ti": Decimal("0.025") * 2**40,
    "0.000000000001Ki": Decimal("1e-12") * 1024,
    ".001": Decimal("0.001"),
    ".0001k": Decimal("0.1"),
    "1.": Decimal(1),
    "1.G": Decimal("1e9"),
}
APIMACHINERY_INVALID = [
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
    "",
]
ISSUE_CASES: list[Any] = [1, ".5", "1e9", "100u"]  # refused before the fix


def _accepts(value: Any) -> bool:
    try:
        ResourceRequirementsSpec.model_validate({"requests": {"cpu": value}})
    except pydantic.ValidationError:
        return False
    return True


def _crd_quantity_schema() -> dict[str, Any]:
    (policy,) = [c for c in generate_crds() if c["spec"]["names"]["kind"] == "AgentPolicy"]
    spec = policy["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    resources = spec["properties"]["pod"]["properties"]["resources"]
    return dict(resources["properties"]["limits"]["additionalProperties"])


@pytest.mark.parametrize("value", ISSUE_CASES)
def test_the_quantities_a_deployment_takes_are_taken(value: Any) -> None:
    assert _accepts(value)


@pytest.mark.parametrize(("text", "value"), sorted(APIMACHINERY_VALID.items()))
def test_apimachinery_valid_quantities_are_taken_and_read_as_kubernetes_reads_them(
    text: str, value: Decimal
) -> None:
    assert _accepts(text)
    assert _accepts("+" + text)
    assert quantity(text) == value
    assert quantity("+" + text) == value


@pytest.mark.parametrize("text", APIMACHINERY_INVALID)
def test_apimachinery_invalid_quantities_are_refused(text: str) -> None:
    assert not _accepts(text)
    with pytest.raises(ValueError, match="quantity"):
        quantity(text)


@pytest.mark.parametrize("value", ["-1", "-0.5Gi", -1, 0.5, 1.5, True, None, "1" * 33])
def test_negatives_floats_booleans_and_overlong_text_are_refused(value: Any) -> None:
    assert not _accepts(value)


def test_a_refusal_names_the_field_and_never_echoes_the_value() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        ResourceRequirementsSpec.model_validate({"limits": {"cpu": "sekrit-1i"}})
    (error,) = caught.value.errors(include_input=False)
    assert error["loc"] == ("limits", "cpu")
    assert "sekrit" not in error["msg"]
    assert "Kubernetes quantity" in error["msg"]


def test_the_crd_says_int_or_string_with_the_same_grammar() -> None:
    schema = _crd_quantity_schema()
    assert schema["x-kubernetes-int-or-string"] is True
    assert schema["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert "type" not in schema  # a structural int-or-string names no type of its own
    assert schema["minimum"] == 0
    pattern = re.compile(schema["pattern"])
    for text in APIMACHINERY_VALID:
        assert pattern.search(text), text
        assert pattern.search("+" + text), text
    for text in [*APIMACHINERY_INVALID, "-1"]:
        assert not pattern.search(text), text


def test_huge_exponents_are_read_without_running_away() -> None:
    assert quantity("1e999999999999999999999999") > Decimal(2**63)
    assert Decimal(0) < quantity("1e-999999999999999999999999") < Decimal("1e-9")
