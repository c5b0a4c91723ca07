"""A real HTTP CONNECT proxy for tests and ``make run``: proxy.py (a maintained PyPI package, pinned in
requirements.lock) in a process of its own, on 127.0.0.1 and a free port, optionally asking for basic
credentials and refusing tunnels to some addresses, as a corporate egress proxy does. It logs each tunnel
(``tunnels``).

Development only: not part of the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_SECONDS = 30.0


class HttpProxy:
    """``with HttpProxy(user="u", password="p") as proxy: proxy.port``. ``refused_hosts``: IP addresses it
    refuses tunnels to (proxy.py answers them with an HTTP error, not a tunnel)."""

    host = "127.0.0.1"

    def __init__(self, *, user: str | None = None, password: str | None = None, refused_hosts: tuple[str, ...] = ()):
        self.user, self.password, self.refused_hosts = user, password, refused_hosts
        self.port = 0
        self._process: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    def start(self) -> "HttpProxy":
        self._dir = tempfile.TemporaryDirectory(prefix="http-proxy-")
        folder = Path(self._dir.name)
        command = [sys.executable, "-m", "proxy", "--hostname", self.host, "--port", "0",
                   "--port-file", str(folder / "port"), "--num-acceptors", "1", "--num-workers", "1", "--threaded",
                   "--log-level", "INFO", "--data-dir", str(folder)]
        if self.user is not None:
            command += ["--basic-auth", f"{self.user}:{self.password}"]
        if self.refused_hosts:
            command += ["--plugins", "proxy.plugin.FilterByUpstreamHostPlugin",
                        "--filtered-upstream-hosts", ",".join(self.refused_hosts)]
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=open(folder / "proxy.log", "wb"), env={**os.environ, "PYTHONPATH": ""})
        deadline = time.monotonic() + START_SECONDS
        while not self.port:
            text = (folder / "port").read_text() if (folder / "port").exists() else ""
            if text.strip():
                self.port = int(text.split()[0])
            elif self._process.poll() is not None or time.monotonic() > deadline:
                log = (folder / "proxy.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"proxy.py did not start: {log}")
            else:
                time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "HttpProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def tunnels(self) -> list[str]:
        """The tunnels it carried (closed ones: proxy.py logs each as it ends), as ``host:port``, in order."""
        log = Path(self._dir.name, "proxy.log").read_text(errors="replace") if self._dir else ""
        return [line.split(" - CONNECT ", 1)[1].split(" ", 1)[0] for line in log.splitlines() if " - CONNECT " in line]

    def sdk_option(self, *, user: str | None = None, password: str | None = None) -> dict:
        """The SDK's ``http_proxy`` keyword for this proxy (with the given credentials, if any)."""
        option: dict = {"proxy_hostname": self.host, "proxy_port": self.port}
        if user is not None:
            option.update(username=user, password=password)
        return option
