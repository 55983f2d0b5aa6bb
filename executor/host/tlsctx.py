"""The listener's TLS: the server context, its in-place rotation, and peer-certificate helpers.

:func:`build_server_context` makes the context the specification asks for: TLS 1.3 unless
``EXECUTOR_TLS_MIN_VERSION=1.2``, which admits TLS 1.2 with ECDHE key exchange and AEAD ciphers
only; no renegotiation, no compression; ALPN offers ``http/1.1`` alone. With
``EXECUTOR_TLS_CLIENT_CA_FILE`` the context asks every connection for a client certificate
(``CERT_OPTIONAL``): a certificate that does not chain to the CA fails the handshake, and a
connection without one is admitted, deliberately, for the kubelet's probes; the door decides
what a certificate-less request may reach.

The private key arrives as a secret handle (``EXECUTOR_TLS_KEY``) and ``ssl`` loads keys only
from a path. We hand it a path that never reaches a disk: an anonymous ``memfd`` opened as
``/proc/self/fd/<n>``, closed (and so freed) right after ``load_cert_chain``. Where ``memfd`` is
unavailable we fall back to a file created ``0600`` inside a fresh ``0700`` directory (under
``key_dir`` if given, ideally the state directory), overwritten with zeros and removed in a
``finally`` immediately after loading.

:class:`ReloadingTlsContext` gives aiohttp one *front* context whose ``sni_callback`` (which
OpenSSL calls on every handshake, with or without SNI) moves the new connection onto the newest
built context. :meth:`ReloadingTlsContext.maybe_reload` rebuilds when the certificate file, the
key's value or the client CA bundle (``EXECUTOR_TLS_CLIENT_CA_FILE``) changed, so a CA taken out
of the bundle stops admitting the certificates it issued at the next handshake; connections
already open keep the context they negotiated. A rebuild that
fails (a half-written file, a key that does not match the certificate) keeps the previous
context and is ``TLS_RELOAD_REFUSED``; a success is ``TLS_CONTEXT_ROTATED``.

Callers: ``assembly.py`` (builds), ``plane.py`` (watches), ``door/door.py``
(:func:`peer_san_uris`, :func:`certificate_sha256`), ``routes/door.py``
(:func:`peer_certificate_der`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from cryptography import x509

from ..codes import Code
from ..errors import ConfigError
from ..events import EventSink
from .durable import write_all
from .metrics import ExecutorMetrics

__all__ = [
    "TLS12_CIPHERS",
    "KeyHandle",
    "ReloadingTlsContext",
    "TlsSettings",
    "build_server_context",
    "certificate_sha256",
    "earliest_not_after",
    "peer_certificate_der",
    "peer_san_uris",
]

# ECDHE key exchange with an AEAD cipher, and nothing else, for TLS 1.2 connections.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!PSK:!SRP:!DSS"


class KeyHandle(Protocol):
    """What TLS needs of a secret handle (``secrets.SecretHandle`` satisfies it)."""

    name: str

    def reveal(self) -> AbstractContextManager[bytearray]: ...


@dataclass(frozen=True)
class TlsSettings:
    """Where the listener's TLS material comes from.

    ``key`` is called on every (re)build so a rotated secret is picked up; ``key_dir`` is the
    fallback directory for the short-lived key file when ``memfd`` is unavailable.
    """

    cert_file: Path
    key: Callable[[], KeyHandle]
    min_version: Literal["1.2", "1.3"] = "1.3"
    client_ca_file: Path | None = None
    key_dir: Path | None = None


def build_server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A fresh server context from the settings; ``ConfigError`` names what is wrong."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if settings.min_version == "1.2":
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(TLS12_CIPHERS)
    elif settings.min_version == "1.3":
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    else:
        raise ConfigError("EXECUTOR_TLS_MIN_VERSION", "must be 1.2 or 1.3")
    ctx.maximum_version = ssl.TLSVersion.MAXIMUM_SUPPORTED
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    ctx.set_alpn_protocols(["http/1.1"])
    if settings.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=os.fspath(settings.client_ca_file))
        except (OSError, ssl.SSLError):
            raise ConfigError(
                "EXECUTOR_TLS_CLIENT_CA_FILE", "cannot be loaded", code=Code.TLS_CLIENT_CA_INVALID
            ) from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    handle = settings.key()
    with handle.reveal() as key_pem:
        _load_chain(ctx, settings.cert_file, key_pem, settings.key_dir)
    return ctx


def _load_chain(
    ctx: ssl.SSLContext, cert_file: Path, key_pem: bytearray, key_dir: Path | None
) -> None:
    def refuse() -> ConfigError:
        return ConfigError(
            "EXECUTOR_TLS_CERT_FILE",
            "the certificate chain or the EXECUTOR_TLS_KEY key cannot be loaded, or they differ",
            code=Code.TLS_MATERIAL_INVALID,
        )

    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd_create("agentsafe-tls-key", getattr(os, "MFD_CLOEXEC", 0))
        try:
            write_all(fd, key_pem)
            try:
                ctx.load_cert_chain(os.fspath(cert_file), f"/proc/self/fd/{fd}")
            except (OSError, ssl.SSLError):
                raise refuse() from None
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="agentsafe-tls-", dir=key_dir)  # created 0700
    path = os.path.join(directory, "key.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(fd, key_pem)
        finally:
            os.close(fd)
        try:
            ctx.load_cert_chain(os.fspath(cert_file), path)
        except (OSError, ssl.SSLError):
            raise refuse() from None
    finally:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY)
            try:
                write_all(fd, bytearray(len(key_pem)))
                os.fsync(fd)
            finally:
                os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


class ReloadingTlsContext:
    """A front ``SSLContext`` for the listener that follows certificate and key rotations."""

    def __init__(
        self,
        settings: TlsSettings,
        *,
        security: EventSink | None = None,
        metrics: ExecutorMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._security = security
        self._metrics = metrics
        self._lock = threading.Lock()
        self._fingerprint = self._material_fingerprint()
        self._current = build_server_context(settings)
        self.context = build_server_context(settings)
        self.context.sni_callback = self._choose

    @property
    def current(self) -> ssl.SSLContext:
        """The newest built context (the one new connections are moved onto)."""
        with self._lock:
            return self._current

    def _choose(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        ssl_object.context = self.current
        return None

    def _material_fingerprint(self) -> tuple[Any, ...]:
        """What a context is built from: the certificate file, the key's value and the client
        CA bundle. A file is taken by its bytes (its digest), so a rewrite in place that keeps
        the size and the modification time is still a change."""
        with self._settings.key().reveal() as key_pem:
            key_digest = hashlib.sha256(key_pem).hexdigest()
        return (
            _file_digest(self._settings.cert_file),
            key_digest,
            _file_digest(self._settings.client_ca_file),
        )

    def maybe_reload(self) -> bool:
        """Rebuild if the certificate file, the key or the client CA bundle changed; True when a
        new context is live (a removed client CA stops admitting its certificates)."""
        try:
            fingerprint = self._material_fingerprint()
        except Exception:
            fingerprint = None
        with self._lock:
            if fingerprint is not None and fingerprint == self._fingerprint:
                return False
        return self.reload(fingerprint=fingerprint)

    def reload(self, *, fingerprint: tuple[Any, ...] | None = None) -> bool:
        """Rebuild now (``POST /v1/control/secrets/reload``); keeps the old context on failure."""
        try:
            fresh = build_server_context(self._settings)
            fingerprint = fingerprint or self._material_fingerprint()
        except ConfigError as exc:
            if self._security is not None:
                self._security.emit("TLS_RELOAD_REFUSED", {"code": exc.code})
            return False
        except Exception:
            if self._security is not None:
                self._security.emit("TLS_RELOAD_REFUSED", {"code": Code.TLS_MATERIAL_INVALID})
            return False
        with self._lock:
            self._current = fresh
            self._fingerprint = fingerprint
        if self._security is not None:
            self._security.emit("TLS_CONTEXT_ROTATED", {"file": "EXECUTOR_TLS_CERT_FILE"})
        if self._metrics is not None:
            self._metrics.tls_rotations.inc()
        return True

    def certificate_expiry(self, now: float) -> dict[str, float]:
        """Seconds from ``now`` to the earliest ``notAfter`` of the serving certificate file
        (``serving``) and of the client CA bundle (``client_ca``), as the files stand now (a
        rotation shows at once); a file that cannot be read or parsed now is left out (blocking:
        call it in a thread)."""
        out: dict[str, float] = {}
        files = {"serving": self._settings.cert_file, "client_ca": self._settings.client_ca_file}
        for name, path in files.items():
            not_after = earliest_not_after(path) if path is not None else None
            if not_after is not None:
                out[name] = not_after - now
        return out

    async def watch(self, *, interval: float = 5.0) -> None:
        """Poll for rotated material every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.maybe_reload)


def earliest_not_after(path: Path) -> float | None:
    """The earliest ``notAfter`` (POSIX seconds) of the PEM certificates in ``path``; ``None``
    when it holds none or cannot be read."""
    try:
        certificates = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not certificates:
        return None
    return min(cert.not_valid_after_utc.timestamp() for cert in certificates)


def _file_digest(path: Path | None) -> str | None:
    """The SHA-256 of a (public) TLS file's bytes; ``""`` when it cannot be read now."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return ""


def peer_certificate_der(transport: Any) -> bytes | None:
    """The verified client certificate (DER) of an aiohttp/asyncio transport, if one was sent."""
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return bytes(der) if der else None


def peer_san_uris(der: bytes) -> tuple[str, ...]:
    """The certificate's SAN URIs; ``ValueError`` when the DER does not parse."""
    cert = x509.load_der_x509_certificate(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ()
    return tuple(san.value.get_values_for_type(x509.UniformResourceIdentifier))


def certificate_sha256(der: bytes) -> str:
    """The certificate pin: lower-case hex SHA-256 of the DER encoding."""
    return hashlib.sha256(der).hexdigest()
