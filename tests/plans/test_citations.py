"""Citation URLs: https only, no credentials, decoded and normalised paths, exact allowlists."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.plans import AgentSafetyError
from agentsafe.executor.plans.citations import (
    canonical_citation,
    canonical_origin,
    canonical_resource_prefix,
    citation_allowed,
)

ORIGINS = ["https://data.example.test"]
PREFIXES = ["/incidents"]


def _allowed(url: str) -> bool:
    _, origin, path = canonical_citation(url)
    return citation_allowed(origin, path, origins=ORIGINS, prefixes=PREFIXES)


@pytest.mark.parametrize(
    "url",
    [
        "http://data.example.test/incidents/1",
        "ftp://data.example.test/incidents/1",
        "https://user:pass@data.example.test/incidents/1",
        "https://token@data.example.test/incidents/1",
        "https://data.example.test/incidents/1?token=abc",
        "https://data.example.test/incidents/1?",
        "https://data.example.test/incidents/1#frag",
        "https://data.example.test/incidents/../secrets",
        "https://data.example.test/incidents/%2e%2e/secrets",
        "https://data.example.test/incidents/%252e%252e/secrets",
        "https://data.example.test/incidents/%25252525252e%25252525252e/x",
        "https://data.example.test/incidents//x",
        "https://data.example.test/incidents/%5cx",
        "https://data.example.test/incidents/a\\b",
        "https://data.example.test/incidents/%00",
        "https://data.example.test/incidents/%ff",
        "https://data.example.test/incidents/ x",
        "https://data.example.test/",
        "https://data.example.test",
        "https://exa mple.test/x",
        "https:///incidents/1",
        "",
        "x" * 3000,
    ],
)
def test_refused(url: str) -> None:
    with pytest.raises(AgentSafetyError) as caught:
        canonical_citation(url)
    assert caught.value.code == "CITATION_REFUSED"


def test_canonical_spellings_collapse() -> None:
    a = canonical_citation("https://DATA.example.test:443/incidents/%41bc")[0]
    b = canonical_citation("https://data.example.test/incidents/Abc")[0]
    assert a == b == "https://data.example.test/incidents/Abc"
    nfd = canonical_citation("https://data.example.test/incidents/e%CC%81")[0]
    nfc = canonical_citation("https://data.example.test/incidents/%C3%A9")[0]
    assert nfd == nfc


def test_allowlists_are_exact() -> None:
    assert _allowed("https://data.example.test/incidents")
    assert _allowed("https://data.example.test/incidents/7")
    assert not _allowed("https://data.example.test/incidents-archive/7")
    assert not _allowed("https://data.example.test:8443/incidents/7")
    assert not _allowed("https://evil.data.example.test/incidents/7")
    assert not _allowed("https://data.example.test/payments/7")
    assert not _allowed("https://data.example.test/%69ncidents-x/7")
    assert _allowed("https://data.example.test/%69ncidents/7")


def test_policy_origin_and_prefix_forms() -> None:
    assert canonical_origin("https://Data.Example.Test:443") == "https://data.example.test"
    assert canonical_origin("https://data.example.test:8443") == "https://data.example.test:8443"
    for bad in ("https://data.example.test/x", "http://data.example.test", "https://u@h.test"):
        with pytest.raises(AgentSafetyError):
            canonical_origin(bad)
    assert canonical_resource_prefix("/inc%69dents") == "/incidents"
    for bad in ("incidents", "/a/../b", "/a?x", "/a//b"):
        with pytest.raises(AgentSafetyError):
            canonical_resource_prefix(bad)


segment = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x2FF, exclude_characters="/\\%?#"),
    min_size=1,
    max_size=8,
).filter(lambda t: t not in (".", ".."))


@given(st.lists(segment, min_size=1, max_size=4))
def test_canonical_form_is_idempotent_and_stays_under_its_prefix(segments: list[str]) -> None:
    from urllib.parse import quote

    url = "https://data.example.test/incidents/" + "/".join(quote(x, safe="") for x in segments)
    try:
        canonical, origin, path = canonical_citation(url)
    except AgentSafetyError:
        return  # refusals are allowed (e.g. decoded control characters); acceptance must be safe
    assert canonical_citation(canonical)[0] == canonical
    assert path.startswith("/incidents/")
    assert ".." not in path.split("/")
    assert citation_allowed(origin, path, origins=ORIGINS, prefixes=PREFIXES)


@given(st.text(max_size=60))
def test_arbitrary_text_is_refused_or_canonical(text: str) -> None:
    try:
        canonical, _, _path = canonical_citation(text)
    except AgentSafetyError:
        return
    assert canonical.startswith("https://")
    assert "?" not in canonical
    assert "#" not in canonical
    assert "@" not in canonical.split("/")[2]
    assert canonical_citation(canonical)[0] == canonical
