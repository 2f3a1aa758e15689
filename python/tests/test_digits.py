"""The digits example as a test: 2 rdmapsd, 4 trainer processes.

Sync SGD must give final parameters bit-identical to a single-process
reference that computes the same four per-rank gradients and applies what
the servers apply: the sum in rank order (rank 0's + rank 1's + ...,
src/server/push.c sync_take), then p - lr * (rescale * sum) in fp32
(src/kernels/optim.c, no contraction).  Async and bounded(2) must learn.
The launch paths (torchrun, Slurm, Open MPI variables) and refusals of a
rank/world mismatch run the same program."""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import digits
import rdmaps

EXAMPLE = digits.__file__
EPOCHS = 15


def run(tmp_path, *args, expect_rc=0, env=None):
    save = tmp_path / "final.npz"
    cmd = [sys.executable, EXAMPLE, "--quiet", "--json", "--save", str(save), "--job-timeout", "240"] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == expect_rc, out
    results = [json.loads(l[len("RESULT "):]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    return results, (dict(np.load(save)) if save.exists() else None), out


def reference(epochs, lr=0.5, batch=64, world=4, hidden=64, seed=0):
    """Single process: the four ranks' gradients of every batch, summed in
    rank order and applied as the servers' SGD does, in fp32."""
    digits.setup_torch()
    xtr, ytr, xte, yte = digits.load_data()
    model = digits.make_model(seed, hidden)
    named = list(model.named_parameters())
    lr32, rescale32 = np.float32(lr), np.float32(1.0 / world)
    for epoch in range(epochs):
        for idx in digits.batches(len(ytr), batch, epoch, seed):
            grads = []
            for r in range(world):
                model.zero_grad(set_to_none=True)
                digits.rank_loss(model, xtr, ytr, digits.rank_slice(idx, r, world)).backward()
                grads.append([p.grad.detach().numpy().copy() for _, p in named])
            with torch.no_grad():
                for i, (_, p) in enumerate(named):
                    acc = grads[0][i].copy()
                    for r in range(1, world):
                        acc += grads[r][i]
                    new = p.detach().numpy() - lr32 * (rescale32 * acc)
                    assert new.dtype == np.float32
                    p.copy_(torch.from_numpy(new))
    return {n: p.detach().numpy().copy() for n, p in named}, digits.accuracy(model, xte, yte)


def test_sync_bit_identical_to_reference(tmp_path):
    results, final, out = run(tmp_path, "--mode", "sync", "--epochs", str(EPOCHS))
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], out
    ref, ref_acc = reference(EPOCHS)
    assert sorted(final) == sorted(ref)
    for n in ref:
        assert final[n].dtype == np.float32 and final[n].shape == ref[n].shape
        same = final[n].view(np.uint32) == ref[n].view(np.uint32)
        assert same.all(), f"{n}: {np.count_nonzero(~same)} of {same.size} values differ"
    accs = {r["acc"] for r in results}
    assert accs == {ref_acc}            # every rank holds the same parameters
    assert ref_acc >= 0.95, out


def test_reference_would_notice_another_sum_order():
    """The bit-identity check can fail: summing in another order changes bits."""
    rng = np.random.RandomState(1)
    g = [rng.standard_normal(10000).astype(np.float32) * 10 ** rng.uniform(-3, 3, 10000).astype(np.float32)
         for _ in range(4)]
    a = ((g[0] + g[1]) + g[2]) + g[3]
    b = ((g[3] + g[2]) + g[1]) + g[0]
    assert not np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("mode,extra", [("async", []), ("bounded", ["--staleness", "2"])])
def test_async_and_bounded_learn(tmp_path, mode, extra):
    results, final, out = run(tmp_path, "--mode", mode, "--epochs", str(EPOCHS), *extra)
    assert len(results) == 4, out
    for r in results:
        assert r["acc"] >= 0.93, out


@pytest.mark.parametrize("launcher,source", [("torchrun", "torchrun"), ("slurm", "slurm"), ("ompi", "openmpi")])
def test_launch_paths(tmp_path, launcher, source):
    results, final, out = run(tmp_path, "--launcher", launcher, "--epochs", "1")
    assert sorted((r["rank"], r["world"], r["source"]) for r in results) == [(i, 4, source) for i in range(4)], out
    assert len({r["acc"] for r in results}) == 1        # sync: all ranks see the same parameters


def test_rank_not_below_world_refused(servers, tmp_path):
    env = dict(os.environ, RDMAPS_SERVERS=servers.uris, RANK="4", WORLD_SIZE="4")
    p = subprocess.run([sys.executable, EXAMPLE, "--worker", "--epochs", "1"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0
    assert "RdmapsError: [EINVAL] rps_client_opts_from_env: RANK=4 is not below WORLD_SIZE=4" in p.stderr, p.stderr


def test_world_size_mismatch_refused(servers):
    """Workers that disagree on the world size cannot share a tensor."""
    with rdmaps.Client(servers.uris, rank=0, world_size=4) as a, \
            rdmaps.Client(servers.uris, rank=1, world_size=3) as b:
        a.tensor("digits-mismatch/w", 16)
        with pytest.raises(rdmaps.RdmapsError) as e:
            b.tensor("digits-mismatch/w", 16)
        assert e.value.errno == errno.EEXIST and "workers" in e.value.message, e.value.message
