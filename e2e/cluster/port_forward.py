"""``kubectl port-forward`` to a pod, as a long-lived child process that heals itself.

Role: on the kind backend the test process is outside the cluster; an agent's calls reach the
executor pod (and the test reads the in-cluster provider) through a port-forward, exactly as a
person would debug a pod. kubectl picks a free local port and prints it
(``Forwarding from 127.0.0.1:NNNNN -> 8443``); :meth:`PortForward.local_port` reads it.

Since kubectl 1.23 (kubernetes/kubernetes#103526) a port-forward exits when one forwarded
connection fails (for instance a connection attempt while the container is not listening yet),
so :meth:`PortForward.local_port` starts a new one whenever the previous one has exited; callers
that poll through it recover on their next attempt. A forward to a deleted pod may outlive it,
so whoever replaces the pod calls :meth:`PortForward.restart` or :meth:`PortForward.close`. The
log of every attempt is kept under ``log_dir`` for diagnosis.

Callers: :mod:`kind_backend`, ``e2e/test_kind_provider.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
from pathlib import Path

from .control_plane import ControlPlane
from .polling import poll

_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")


class PortForwardFailed(AssertionError):
    """kubectl port-forward exited before it listened; the message carries its output."""


@dataclasses.dataclass
class PortForward:
    """A port-forward from ``127.0.0.1:<random>`` to ``target`` (``pod/NAME``) in ``namespace``."""

    plane: ControlPlane
    namespace: str
    target: str
    remote_port: int
    log_dir: Path
    start_deadline: float = 30.0
    _popen: subprocess.Popen[bytes] | None = None
    _port: int | None = None
    _starts: int = 0

    @property
    def starts(self) -> int:
        """How many kubectl processes were started (1 when it never had to heal)."""
        return self._starts

    def local_port(self) -> int:
        """The local port, starting (or restarting) kubectl first when it is not running."""
        if self._popen is None or self._popen.poll() is not None or self._port is None:
            self._start()
        assert self._port is not None
        return self._port

    def restart(self) -> int:
        """A new kubectl process (after the pod behind ``target`` was replaced)."""
        self.close()
        return self.local_port()

    def log(self) -> str:
        path = self._log_path(self._starts)
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def _log_path(self, attempt: int) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.namespace}-{self.target}")
        return self.log_dir / f"port-forward-{safe}-{attempt}.log"

    def _start(self) -> None:
        self.close()
        self._starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self._log_path(self._starts)
        argv = [
            str(self.plane.tools.kubectl),
            "port-forward",
            "--address",
            "127.0.0.1",
            "--namespace",
            self.namespace,
            self.target,
            f":{self.remote_port}",
        ]
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                argv,
                env=self.plane.env(),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._popen = popen

        def listening() -> int | None:
            found = _FORWARDING.search(log.read_bytes())
            if found is not None:
                return int(found.group(1))
            if popen.poll() is not None:
                raise PortForwardFailed(
                    f"kubectl port-forward {self.target} exited {popen.returncode}:\n"
                    f"{log.read_text(errors='replace')}"
                )
            return None

        try:
            self._port = poll(
                f"kubectl port-forward {self.namespace}/{self.target}",
                listening,
                deadline=self.start_deadline,
                interval=0.1,
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        popen, self._popen, self._port = self._popen, None, None
        if popen is None:
            return
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
        else:
            popen.wait()
