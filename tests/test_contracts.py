"""The provider contract in ``pyproject.toml`` forbids every executor module but the ground
floor and RFC 9421 (``egress/httpsig.py``).

``provider.py`` is what a system of record vendors: import-linter's forbidden contract takes a
list of modules, and one added to ``executor/`` and forgotten there could be imported by the
provider unseen. This test keeps the list equal to the folder (parses ``pyproject.toml``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXECUTOR = REPO / "executor"
RFC_9421 = "agentsafe.executor.egress.httpsig"


def _contracts() -> list[dict[str, object]]:
    loaded = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = loaded["tool"]["importlinter"]["contracts"]
    return contracts


def _one(source: str) -> dict[str, object]:
    [contract] = [c for c in _contracts() if c.get("source_modules") == [source]]
    return contract


def _ground_floor() -> set[str]:
    [floor] = [c for c in _contracts() if str(c["name"]).startswith("the ground floor")]
    return {str(m) for m in floor["source_modules"]}  # type: ignore[attr-defined]


def _tops() -> set[str]:
    """Every top-level module and package of the executor (``client`` is its own root)."""
    out = set()
    for path in EXECUTOR.iterdir():
        if path.suffix == ".py" and path.stem != "__init__":
            out.add(f"agentsafe.executor.{path.stem}")
        elif (path / "__init__.py").is_file() and path.name != "client":
            out.add(f"agentsafe.executor.{path.name}")
    return out


def _forbidden_for_the_provider(tops: set[str]) -> set[str]:
    egress = {
        f"agentsafe.executor.egress.{p.stem}"
        for p in (EXECUTOR / "egress").glob("*.py")
        if p.stem != "__init__"
    }
    others = tops - _ground_floor() - {"agentsafe.executor.provider", "agentsafe.executor.egress"}
    return others | (egress - {RFC_9421})


def test_the_provider_contract_forbids_everything_but_the_floor_and_rfc_9421() -> None:
    contract = _one("agentsafe.executor.provider")
    forbidden = {str(m) for m in contract["forbidden_modules"]}  # type: ignore[attr-defined]
    expected = _forbidden_for_the_provider(_tops())
    assert expected - forbidden == set(), "a module the provider may reach is not forbidden"
    assert RFC_9421 not in forbidden


def test_the_list_is_derived_from_the_folder() -> None:
    expected = _forbidden_for_the_provider(_tops())
    assert "agentsafe.executor.routes" in expected
    assert "agentsafe.executor.egress.guard" in expected
    assert "agentsafe.executor.canonical" not in expected
    assert _forbidden_for_the_provider(_tops() | {"agentsafe.executor.new"}) >= {
        "agentsafe.executor.new"
    }


def test_the_supervisor_has_a_contract() -> None:
    contract = _one("agentsafe.executor.supervisor")
    forbidden = set(contract["forbidden_modules"])  # type: ignore[call-overload]
    assert {"aiohttp", "agentsafe.executor.plane", "agentsafe.executor.routes"} <= forbidden


def test_no_serving_module_may_import_the_provider() -> None:
    """The contract that keeps ``provider.py`` out of the serving process names every
    executor module but the CLI, the dev tools, the provider itself and the ground floor (which
    its own contract already keeps below the provider)."""
    [contract] = [
        c for c in _contracts() if c.get("forbidden_modules") == ["agentsafe.executor.provider"]
    ]
    sources = {str(m) for m in contract["source_modules"]}  # type: ignore[attr-defined]
    exempt = {"agentsafe.executor.cli", "agentsafe.executor.tools", "agentsafe.executor.provider"}
    expected = _tops() - _ground_floor() - exempt
    assert expected - sources == set(), "a serving module may import provider.py unseen"


def test_the_servers_receipt_type_is_the_providers() -> None:
    from agentsafe.executor import provider
    from agentsafe.executor.effects import receipts

    assert receipts.EFFECT_RECEIPT_TYP == provider.EFFECT_RECEIPT_TYP
