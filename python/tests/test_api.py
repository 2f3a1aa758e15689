"""The rdmaps package against two real rdmapsd: round trips, requests,
every error path, threads and the GIL."""
import ctypes
import errno
import gc
import itertools
import os
import threading
import time

import numpy as np
import pytest
import torch

import rdmaps
from rdmaps import _lib

_names = itertools.count()


def name(tag="t"):
    return f"api/{tag}{next(_names)}"


@pytest.fixture
def client(servers):
    with rdmaps.Client(servers.uris, rank=0, world_size=1, timeout_ms=10000) as c:
        yield c


def bf16_bits(x):
    """float32 -> bf16 bits (exact for the values used here)."""
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


# ---- the mirror of the C structs ----

def test_structs_match_the_library():
    assert _lib.library_sizeof(_lib.ClientOpts) == ctypes.sizeof(_lib.ClientOpts)
    assert _lib.library_sizeof(_lib.TensorOpts) == ctypes.sizeof(_lib.TensorOpts)


def test_defaults_are_the_c_defaults(client):
    t = client.tensor(name(), 3)
    i = t.info()
    assert (i["dtype"], i["mode"], i["optimizer"]) == ("f32", "sync", "sum")
    assert i["lr"] == pytest.approx(0.01) and i["rescale"] == 1.0 and i["count"] == 3
    assert rdmaps.version().count(".") == 2


# ---- round trips ----

@pytest.mark.parametrize("dtype,make", [
    ("f32", lambda v: np.full(8, v, np.float32)),
    ("f16", lambda v: np.full(8, v, np.float16)),
    ("bf16", lambda v: bf16_bits(np.full(8, v, np.float32))),
    ("f32", lambda v: torch.full((8,), v, dtype=torch.float32)),
    ("f16", lambda v: torch.full((8,), v, dtype=torch.float16)),
    ("bf16", lambda v: torch.full((8,), v, dtype=torch.bfloat16)),
])
def test_push_pull_round_trip(client, dtype, make):
    init = np.arange(8, dtype=np.float32)
    t = client.tensor(name(dtype), 8, dtype=dtype, init=init)
    t.push(make(1.5))
    t.push(make(-0.25))
    np.testing.assert_array_equal(t.pull(), init + 1.25)
    out = torch.empty(8)
    assert t.pull(out) is out
    assert torch.equal(out, torch.from_numpy(init + 1.25))
    assert t.version == 2


def test_clock_counts_pushes(client):
    t = client.tensor(name(), 8, mode="bounded", staleness=2)
    assert t.clock == 0
    t.push(np.ones(8, np.float32))
    t.push(np.ones(8, np.float32))
    assert t.clock == 2
    t.close()
    with pytest.raises(ValueError):
        t.clock


def test_multidimensional_buffers(client):
    t = client.tensor(name(), 6, optimizer="sgd", lr=0.5)
    t.push(np.ones((2, 3), np.float32))
    out = np.empty((3, 2), np.float32)
    t.pull(out)
    np.testing.assert_array_equal(out, np.full((3, 2), -0.5, np.float32))


def test_pull_is_zero_copy_into_the_destination(client):
    t = client.tensor(name(), 4, init=np.full(4, 7, np.float32))
    big = torch.zeros(10)
    t.pull(big[2:6])          # a contiguous view: written in place
    assert big.tolist() == [0, 0, 7, 7, 7, 7, 0, 0, 0, 0]


def test_init_kept_from_the_first_creator(servers, client):
    n = name()
    a = client.tensor(n, 4, init=np.full(4, 1, np.float32))
    with rdmaps.Client(servers.uris, rank=0, world_size=1) as c2:
        b = c2.tensor(n, 4, init=np.full(4, 2, np.float32))
        np.testing.assert_array_equal(b.pull(), np.ones(4, np.float32))
    np.testing.assert_array_equal(a.pull(), np.ones(4, np.float32))


# ---- requests ----

def test_requests_wait_test_and_with(client):
    t = client.tensor(name(), 1000, mode="async")
    g = np.ones(1000, np.float32)
    r = t.push_start(g)
    r.wait()
    assert r.done and r.result is g
    r = t.push_start(g)
    while not r.test():
        pass
    assert r.test()            # done stays done
    with t.push_start(g):
        pass
    with t.pull_start() as p:
        pass
    np.testing.assert_array_equal(p.result, np.full(1000, 3, np.float32))
    assert p.version is not None and p.version >= 1
    assert "done" in repr(p)


def test_request_keeps_its_buffer_alive(client):
    t = client.tensor(name(), 1 << 16, mode="async")
    reqs = [t.push_start(np.full(1 << 16, 2, np.float32)) for _ in range(4)]   # no other reference
    gc.collect()
    for r in reqs:
        r.wait()
    pr = t.pull_start()        # its destination allocated and owned by the request
    gc.collect()
    np.testing.assert_array_equal(pr.wait(), np.full(1 << 16, 8, np.float32))


def test_dropped_request_is_waited_for(client):
    t = client.tensor(name(), 1 << 16, mode="async")
    t.push_start(np.ones(1 << 16, np.float32))     # dropped at once
    gc.collect()
    np.testing.assert_array_equal(t.pull(), np.ones(1 << 16, np.float32))


def test_failed_request_raises_with_message(own_servers):
    c = rdmaps.Client(own_servers.uris, rank=0, world_size=2, timeout_ms=1500)
    t = c.tensor(name(), 4)                       # sync, 2 workers: rank 1 never pushes
    r = t.push_start(np.ones(4, np.float32))      # (replicated: waits for the whole step)
    with pytest.raises(rdmaps.RdmapsError) as e:
        r.wait()
    assert e.value.errno == errno.ETIMEDOUT and e.value.message
    with pytest.raises(rdmaps.RdmapsError):
        r.wait()                                   # the same failure again, not a crash
    c.close()


# ---- error paths ----

def test_wrong_size(client):
    t = client.tensor(name(), 8)
    with pytest.raises(ValueError, match="7 elements given, the tensor has 8"):
        t.push(np.ones(7, np.float32))
    with pytest.raises(ValueError, match="9 elements"):
        t.pull(np.empty(9, np.float32))
    with pytest.raises(ValueError):
        t.push_start(torch.ones(9))
    with pytest.raises(ValueError):
        client.tensor(name(), 8, init=np.ones(4, np.float32))


def test_wrong_dtype(client):
    t = client.tensor(name(), 8)
    for bad in (np.ones(8, np.float64), np.ones(8, np.int32), np.ones(8, np.float16), np.ones(8, np.uint16),
                torch.ones(8, dtype=torch.float64), torch.ones(8, dtype=torch.bfloat16), [1.0] * 8,
                np.ones(8, ">f4")):
        with pytest.raises(TypeError):
            t.push(bad)
    with pytest.raises(TypeError, match="float32 destination"):
        t.pull(np.empty(8, np.float16))
    with pytest.raises(TypeError, match="float64"):
        t.pull(np.empty(8, np.float64))
    b = client.tensor(name(), 8, dtype="bf16")
    with pytest.raises(TypeError, match="bf16"):
        b.push(np.ones(8, np.float32))
    with pytest.raises(TypeError):
        client.tensor(name(), 8, dtype=np.float64)


def test_non_contiguous(client):
    t = client.tensor(name(), 8)
    with pytest.raises(ValueError, match="not C-contiguous"):
        t.push(np.ones(16, np.float32)[::2])
    with pytest.raises(ValueError, match="not contiguous"):
        t.push(torch.ones(4, 2).t())
    with pytest.raises(ValueError, match="not C-contiguous"):
        t.pull(np.empty(16, np.float32)[::2])
    ro = np.empty(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        t.pull(ro)


def test_unknown_tensor(client):
    with pytest.raises(rdmaps.RdmapsError) as e:
        client.open("api/no-such-tensor")
    assert isinstance(e.value, OSError)
    assert e.value.errno == errno.ENOENT
    assert "does not know this tensor" in e.value.message
    assert "ENOENT" in str(e.value)


def test_bad_options_are_the_librarys_errors(client):
    with pytest.raises(rdmaps.RdmapsError) as e:   # (count 0 is Python's ValueError: see below)
        client.tensor(name(), 4, optimizer="adam", beta1=1.0)
    assert e.value.errno == errno.EINVAL and "beta1" in e.value.message
    with pytest.raises(rdmaps.RdmapsError) as e:
        client.tensor("has space", 4)
    assert e.value.errno == errno.EINVAL
    n = name()
    client.tensor(n, 4)
    with pytest.raises(rdmaps.RdmapsError) as e:
        client.tensor(n, 5)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(ValueError):
        client.tensor(name(), 4, mode="eventual")


def test_closed_handles(servers):
    c = rdmaps.Client(servers.uris, rank=0, world_size=1)
    t = c.tensor(name(), 2)
    t.close()
    with pytest.raises(ValueError, match="closed"):
        t.push(np.ones(2, np.float32))
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.tensor(name(), 2)


def test_dead_server(own_servers):
    c = rdmaps.Client(own_servers.uris, rank=0, world_size=1, timeout_ms=2000)
    t = c.tensor(name(), 4, mode="async")
    t.push(np.ones(4, np.float32))
    own_servers.kill(0)
    own_servers.kill(1)
    with pytest.raises(rdmaps.RdmapsError) as e:
        t.push(np.ones(4, np.float32))
        t.pull()
    assert e.value.errno in (errno.ECONNRESET, errno.ETIMEDOUT, errno.ECONNREFUSED, errno.EPIPE,
                             errno.ENOTCONN, errno.ECONNABORTED, rdmaps.ESTALE_EPOCH)
    assert e.value.message
    c.close()
    with pytest.raises(rdmaps.RdmapsError) as e:
        rdmaps.Client(own_servers.uris, rank=0, world_size=1, timeout_ms=2000)
    assert e.value.errno in (errno.ECONNREFUSED, errno.ETIMEDOUT) and e.value.message


def test_connect_errors(servers):
    with pytest.raises(rdmaps.RdmapsError) as e:
        rdmaps.Client(servers.uris, rank=4, world_size=4)
    assert e.value.errno == errno.EINVAL and "rank 4" in e.value.message
    with pytest.raises(rdmaps.RdmapsError) as e:
        rdmaps.Client()                       # no servers given, RDMAPS_SERVERS unset
    assert e.value.errno == errno.ENOENT and "RDMAPS_SERVERS" in e.value.message


# ---- the environment (rps_client_opts_from_env) ----

def test_client_from_env(servers, monkeypatch):
    monkeypatch.setenv("RDMAPS_SERVERS", servers.uris)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    with rdmaps.Client() as c:
        assert (c.source, c.rank, c.world_size, c.servers) == ("openmpi", 0, 1, servers.uris)
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(rdmaps.RdmapsError) as e:
        rdmaps.Client()
    assert e.value.errno == errno.EINVAL and "RANK='x'" in e.value.message
    with rdmaps.Client(rank=0, world_size=1) as c:   # the caller's win; nothing read
        assert c.source == "caller"
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    with rdmaps.Client() as c:                # no launcher: rank 0 of 1
        assert (c.source, c.rank, c.world_size) == ("none", 0, 1)


def test_debug_log_names_the_launcher(servers, monkeypatch, caplog):
    monkeypatch.setenv("RDMAPS_SERVERS", servers.uris)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    with caplog.at_level("DEBUG", logger="rdmaps"):
        rdmaps.Client().close()
    assert "rank 0 of 1 from slurm" in caplog.text


# ---- threads and the GIL ----

def test_threads_push_while_others_pull(client):
    n, k, pushers = 1 << 14, 20, 4
    t = client.tensor(name(), n, mode="async")
    errors = []
    done = threading.Event()

    def push():
        try:
            g = np.ones(n, np.float32)
            for _ in range(k):
                t.push(g)
        except Exception as e:      # pragma: no cover - reported below
            errors.append(e)

    def pull():
        try:
            out = np.empty(n, np.float32)
            last = 0.0
            while not done.is_set():
                t.pull(out)
                # never torn: one value throughout, and never going back
                assert (out == out[0]).all() and out[0] >= last
                last = out[0]
        except Exception as e:      # pragma: no cover
            errors.append(e)

    ths = [threading.Thread(target=push) for _ in range(pushers)]
    pls = [threading.Thread(target=pull) for _ in range(2)]
    for th in ths + pls:
        th.start()
    for th in ths:
        th.join(60)
    done.set()
    for th in pls:
        th.join(60)
    assert not errors
    np.testing.assert_array_equal(t.pull(), np.full(n, pushers * k, np.float32))


def test_last_error_is_read_in_the_failing_thread(client):
    bad = []

    def fail(tag):
        for _ in range(30):
            try:
                client.open(f"api/missing-{tag}")
            except rdmaps.RdmapsError as e:
                if f"missing-{tag}" not in e.message:
                    bad.append(e.message)
    ths = [threading.Thread(target=fail, args=(x,)) for x in "abcd"]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    assert not bad


def test_gil_released_during_a_blocking_pull(servers):
    """Rank 0's sync push and pull block until rank 1 pushes (with 2
    servers the partitions are replicated, so the push itself waits for
    the step); meanwhile this (the main) thread must run Python code.
    Were the GIL held, the main thread would not run until the call timed
    out, and it would fail."""
    n = name()
    c0 = rdmaps.Client(servers.uris, rank=0, world_size=2, timeout_ms=20000)
    c1 = rdmaps.Client(servers.uris, rank=1, world_size=2, timeout_ms=20000)
    t0 = c0.tensor(n, 4)
    t1 = c1.tensor(n, 4)
    entered, result = threading.Event(), {}

    def blocked_pull():
        entered.set()
        try:
            t0.push(np.ones(4, np.float32))
            result["out"] = t0.pull()
        except Exception as e:
            result["err"] = e

    th = threading.Thread(target=blocked_pull)
    th.start()
    assert entered.wait(20)
    spins, t_end = 0, time.monotonic() + 0.3
    while time.monotonic() < t_end:
        spins += 1
    assert spins > 1000
    assert th.is_alive() and not result       # still inside the C call while we ran
    t1.push(np.full(4, 2, np.float32))        # completes the step
    th.join(20)
    assert not th.is_alive()
    assert "err" not in result, result.get("err")
    np.testing.assert_array_equal(result["out"], np.full(4, 3, np.float32))
    c0.close()
    c1.close()


# ---- validation at the edges: every value checked against its C type ----

@pytest.mark.parametrize("kw", [
    dict(rank=2 ** 32 + 1, world_size=4),       # ctypes would make it rank 1
    dict(rank=-1, world_size=4),
    dict(rank=2 ** 31, world_size=4),
    dict(rank=0, world_size=2 ** 32 + 4),       # ... world size 4
    dict(rank=0, world_size=0),
    dict(rank=0, world_size=-3),
    dict(rank=0, world_size=1, timeout_ms=2 ** 32 + 10000),
    dict(rank=0, world_size=1, timeout_ms=-5),
    dict(rank=0, world_size=1, spin_us=2 ** 31),
    dict(rank=0, world_size=1, staging_bytes=0),
    dict(rank=0, world_size=1, staging_bytes=2 ** 64),
])
def test_client_ints_out_of_range(servers, kw):
    with pytest.raises(ValueError, match="is outside"):
        rdmaps.Client(servers.uris, **kw)


def test_client_ints_at_the_edges(servers):
    with rdmaps.Client(servers.uris, rank=3, world_size=4, timeout_ms=2 ** 31 - 1) as c:
        assert (c.rank, c.world_size) == (3, 4)


def test_client_staging_at_its_floor(servers):
    # one byte of budget: one slot and one pull buffer per endpoint, exact
    n = name("floor")
    with rdmaps.Client(servers.uris, rank=0, world_size=1, staging_bytes=1) as c:
        t = c.tensor(n, 1000, mode="async")
        for _ in range(5):
            t.push(np.ones(1000, np.float32))
        assert list(t.pull()) == [5.0] * 1000


def test_tensor_name_with_nul_refused(client):
    n = name("nul")
    with pytest.raises(ValueError, match="NUL"):
        client.tensor(n + "\0b", 8, mode="async")
    with pytest.raises(ValueError, match="NUL"):
        client.open(n + "\0b")
    with pytest.raises(rdmaps.RdmapsError) as e:   # nothing was created under the cut name
        client.open(n)
    assert e.value.errno == errno.ENOENT


@pytest.mark.parametrize("count", [0, -1, 2 ** 63 + 1, 2 ** 64 + 1, -(2 ** 64) + 1])
def test_tensor_count_out_of_range(client, count):
    with pytest.raises(ValueError, match="count"):
        client.tensor(name("count"), count, mode="async")


@pytest.mark.parametrize("staleness", [-1, 2 ** 32, 2 ** 32 + 2])
def test_tensor_staleness_out_of_range(client, staleness):
    with pytest.raises(ValueError, match="staleness"):
        client.tensor(name("stale"), 8, mode="bounded", staleness=staleness)


@pytest.mark.parametrize("knob", ["lr", "momentum", "beta1", "beta2", "eps", "weight_decay", "rescale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e39])
def test_tensor_hyper_not_finite(client, knob, value):
    n = name("hyper")
    with pytest.raises(ValueError, match=knob):
        client.tensor(n, 8, mode="async", optimizer="adam", **{knob: value})
    with pytest.raises(rdmaps.RdmapsError) as e:
        client.open(n)
    assert e.value.errno == errno.ENOENT


# ---- the loopback key (doc/security.md): servers started without --key ----

def test_loopback_key_keeps_other_users_out(servers, tmp_path, monkeypatch):
    key = os.path.join(os.environ["RDMAPS_RUNTIME_DIR"], "loopback.key")
    assert os.stat(key).st_mode & 0o777 == 0o600           # made by the servers (conftest's directory)
    assert os.stat(os.path.dirname(key)).st_mode & 0o777 == 0o700
    with rdmaps.Client(servers.uris, rank=0, world_size=1, timeout_ms=10000) as c:   # this user: in
        t = c.tensor(name("lo"), 4, mode="async")
        t.push(np.ones(4, np.float32))
        assert t.pull().tolist() == [1, 1, 1, 1]
    other = tmp_path / "other-user"                         # another user's view: no key
    other.mkdir(mode=0o700)
    monkeypatch.setenv("RDMAPS_RUNTIME_DIR", str(other))
    with pytest.raises(rdmaps.RdmapsError) as e:
        rdmaps.Client(servers.uris, rank=0, world_size=1, timeout_ms=10000)
    assert e.value.errno == errno.ECONNREFUSED
    assert "key required" in e.value.message and str(other) in e.value.message
