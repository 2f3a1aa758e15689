"""rdmapsd servers on loopback, for examples and tests.

    with rdmaps.local.LocalServers(2) as servers:
        client = rdmaps.Client(servers.uris, rank=0, world_size=1)

Each server is started with ``--port-file`` and is ready once the file
exists (polled, while checking the process is alive); ``stop()`` sends
SIGTERM and waits.  The binary is ``rdmapsd=`` if given, else
$RDMAPS_RDMAPSD, else the build tree's (beside this package), else the
one on PATH, /usr/local/sbin or /usr/sbin.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import List, Optional

__all__ = ["LocalServers", "find_rdmapsd"]


def find_rdmapsd(path: Optional[str] = None) -> str:
    """Path of the rdmapsd binary to run (see the module's docstring)."""
    if path:
        return path
    if os.environ.get("RDMAPS_RDMAPSD"):
        return os.environ["RDMAPS_RDMAPSD"]
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.normpath(os.path.join(here, "..", "..", "rdmapsd"))
    if os.access(tree, os.X_OK):
        return tree
    for p in (shutil.which("rdmapsd"), "/usr/local/sbin/rdmapsd", "/usr/sbin/rdmapsd"):
        if p and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError("rdmapsd not found: build the tree, install it, or set RDMAPS_RDMAPSD")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServers:
    """n rdmapsd processes forming one cluster on 127.0.0.1 (TCP)."""

    def __init__(self, n: int = 2, rdmapsd: Optional[str] = None, extra_args: Optional[List[str]] = None,
                 log_level: str = "warn", ready_timeout: float = 60.0):
        self.binary = find_rdmapsd(rdmapsd)
        self.dir = tempfile.mkdtemp(prefix="rdmaps-local.")
        self.ports = []
        while len(self.ports) < n:      # distinct ports (the kernel may hand one out twice)
            p = _free_port()
            if p not in self.ports:
                self.ports.append(p)
        self.uri_list = [f"tcp://127.0.0.1:{p}" for p in self.ports]
        self.uris = ",".join(self.uri_list)
        self.procs: List[subprocess.Popen] = []
        try:
            for i in range(n):
                log = open(os.path.join(self.dir, f"rdmapsd.{i}.log"), "wb")
                cmd = [self.binary, "--listen", self.uri_list[i], "--cluster", self.uris, "--index", str(i),
                       "--port-file", os.path.join(self.dir, f"port.{i}"), "--log-level", log_level]
                self.procs.append(subprocess.Popen(cmd + list(extra_args or []), stdout=log,
                                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                log.close()
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for i, p in enumerate(self.procs):
            pf = os.path.join(self.dir, f"port.{i}")
            while not os.path.exists(pf):
                if p.poll() is not None:
                    raise RuntimeError(f"rdmapsd {i} exited ({p.returncode}) during start-up: {self.log(i)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rdmapsd {i} not ready after {timeout} s: {self.log(i)}")
                time.sleep(0.01)

    def log(self, i: int) -> str:
        try:
            with open(os.path.join(self.dir, f"rdmapsd.{i}.log"), errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def kill(self, i: int) -> None:
        """SIGKILL server i (to test a dead server)."""
        p = self.procs[i]
        if p.poll() is None:
            p.kill()
            p.wait()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalServers":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
