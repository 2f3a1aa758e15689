"""Fixtures: rdmapsd on loopback (rdmaps.local.LocalServers: ready when its
--port-file appears, polled with the process checked alive, no fixed sleep)."""
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

from rdmaps.local import LocalServers  # noqa: E402

LAUNCH_VARS = ["RDMAPS_SERVERS", "RDMAPS_RANK", "RDMAPS_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID",
               "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"]


# The loopback key the servers started without --key make (and every client
# finds): one directory for this run, never the user's own ~/.rdmaps.  Set
# at import, before any fixture starts a server or a test a client.
_RUNTIME = tempfile.mkdtemp(prefix="rdmaps-runtime.")
os.environ["RDMAPS_RUNTIME_DIR"] = _RUNTIME
os.environ.pop("RDMAPS_KEY_FILE", None)
os.environ.pop("RDMAPS_INSECURE", None)


def pytest_unconfigure(config):
    shutil.rmtree(_RUNTIME, ignore_errors=True)


@pytest.fixture(autouse=True)
def clean_launch_env(monkeypatch):
    """No launcher variable leaks in from the environment make check runs in."""
    for v in LAUNCH_VARS:
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="module")
def servers():
    """Two rdmapsd forming one cluster, for the whole module."""
    s = LocalServers(2)
    yield s
    s.stop()


@pytest.fixture
def own_servers():
    """Two rdmapsd for one test (which may kill them)."""
    s = LocalServers(2)
    yield s
    s.stop()
