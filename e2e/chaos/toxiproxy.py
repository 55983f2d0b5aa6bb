"""toxiproxy v2.5.0 (built by ``make e2e-build``): its process and the API calls the nemesis uses.

Role: every replica reaches the database and the provider through its own proxy, so a partition
is a real TCP fault: :meth:`Toxiproxy.partition` disables a proxy (toxiproxy closes its
connections and refuses new ones), :meth:`Toxiproxy.heal` enables it again;
:meth:`Toxiproxy.latency` adds a latency toxic (the nemesis widens a lifecycle window with it)
and :meth:`Toxiproxy.clear` removes every toxic. :meth:`Toxiproxy.retarget` points a proxy at
another upstream (the standby's replication link after a failover).

Callers: ``chaos/system.py``.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["Toxiproxy"]


class Toxiproxy:
    def __init__(self, binary: Path, port: int, log: Path) -> None:
        self.binary = binary
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(self.binary), "-host", "127.0.0.1", "-port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin", "LOG_LEVEL": "warn"},
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"toxiproxy exited; see {self.log}")
            try:
                self._call("GET", "/proxies")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("content-type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else None

    def create(self, name: str, listen_port: int, upstream_port: int) -> None:
        self._call(
            "POST",
            "/proxies",
            {
                "name": name,
                "listen": f"127.0.0.1:{listen_port}",
                "upstream": f"127.0.0.1:{upstream_port}",
                "enabled": True,
            },
        )

    def retarget(self, name: str, upstream_port: int) -> None:
        self._call("POST", f"/proxies/{name}", {"upstream": f"127.0.0.1:{upstream_port}"})

    def partition(self, name: str) -> None:
        self._call("POST", f"/proxies/{name}", {"enabled": False})

    def heal(self, name: str) -> None:
        self._call("POST", f"/proxies/{name}", {"enabled": True})

    def latency(self, name: str, milliseconds: int, *, stream: str = "upstream") -> None:
        """Delay every chunk on ``stream`` (upstream: toward the server) by ``milliseconds``."""
        self._call(
            "POST",
            f"/proxies/{name}/toxics",
            {
                "name": f"latency_{stream}",
                "type": "latency",
                "stream": stream,
                "toxicity": 1.0,
                "attributes": {"latency": milliseconds, "jitter": 0},
            },
        )

    def clear(self, name: str) -> None:
        try:
            toxics = self._call("GET", f"/proxies/{name}/toxics") or []
        except urllib.error.HTTPError:
            return
        for toxic in toxics:
            self._call("DELETE", f"/proxies/{name}/toxics/{toxic['name']}")
