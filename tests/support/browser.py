"""A real browser for tests: Debian's chromium driven by Playwright, with a virtual passkey.

No browser is downloaded: Playwright launches ``/usr/bin/chromium`` (``apt-get install
chromium``; ``make unit`` installs it as root on a fresh machine, ``.ci/run`` does too). Without
it the browser tests skip with one line, and fail under ``CI=true``.

WebAuthn needs a secure context whose certificate the browser trusts: the executor serves real
TLS with a certificate from ``tests.support.pki``, and chromium is told to trust exactly that
certificate's public key (``--ignore-certificate-errors-spki-list``), so the page is a secure
context with no certificate error and nothing else is trusted. The authenticator is Chrome's
virtual one, added over the DevTools protocol (``WebAuthn.enable``,
``WebAuthn.addVirtualAuthenticator``: CTAP2, internal, resident keys, user verification).

Screenshots go to ``build/artifacts/approval-page/`` (git-ignored); ``tests/conftest.py`` prints
the path at the end of the run.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import Certificate

CHROMIUM = Path(os.environ.get("AGENTSAFE_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "artifacts" / "approval-page"


def spki_base64(cert: Certificate) -> str:
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def require_chromium() -> None:
    if CHROMIUM.exists():
        return
    message = f"no chromium at {CHROMIUM}: run `make unit` as root (apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def artifact_dir(name: str) -> Path:
    directory = ARTIFACTS / name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@asynccontextmanager
async def chromium_page(server_cert: Certificate) -> AsyncIterator[Any]:
    """One page in a fresh headless chromium with a virtual WebAuthn authenticator."""
    require_chromium()
    from playwright.async_api import async_playwright

    args = [f"--ignore-certificate-errors-spki-list={spki_base64(server_cert)}"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # chromium's sandbox refuses root; CI runs as root
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=args
        )
        try:
            context = await browser.new_context()
            page = await context.new_page()
            cdp = await context.new_cdp_session(page)
            await cdp.send("WebAuthn.enable")
            await cdp.send(
                "WebAuthn.addVirtualAuthenticator",
                {
                    "options": {
                        "protocol": "ctap2",
                        "transport": "internal",
                        "hasResidentKey": True,
                        "hasUserVerification": True,
                        "isUserVerified": True,
                        "automaticPresenceSimulation": True,
                    }
                },
            )
            yield page
        finally:
            await browser.close()
