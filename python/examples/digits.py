#!/usr/bin/env python3
"""Train an MLP on scikit-learn's bundled handwritten digits with rdmaps.

By default this starts 2 rdmapsd on loopback and 4 trainer processes; each
trainer takes a deterministic slice (by rank) of every batch, pushes its
gradients from autograd hooks and pulls the servers' parameters (SGD on the
servers, rescale 1/world).  Rank 0 prints, per epoch, the mean training
loss, the test accuracy and the share of step time spent waiting on
communication.

    python3 python/examples/digits.py                       # 2 servers, 4 trainers, sync
    python3 python/examples/digits.py --mode async
    python3 python/examples/digits.py --launcher torchrun   # children get RANK/WORLD_SIZE
    python3 python/examples/digits.py --servers tcp://h1:7000,tcp://h2:7000 --worker   # one trainer,
                                                            # rank/world from its launcher (srun, torchrun, ...)

The data ship with python3-sklearn (no download).  Deterministic: fixed
seeds, torch.use_deterministic_algorithms(True), one thread.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))     # the package beside (build tree / source tree)

import rdmaps                   # noqa: E402
import rdmaps.torch             # noqa: E402
from rdmaps.local import LocalServers   # noqa: E402

LAUNCHERS = {
    "rdmaps": ("RDMAPS_RANK", "RDMAPS_WORLD_SIZE"),
    "torchrun": ("RANK", "WORLD_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS"),
    "ompi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
}
ALL_LAUNCH_VARS = ["RDMAPS_RANK", "RDMAPS_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                   "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"]


# ---- the model, the data and one rank's gradient: shared with the tests' reference ----

def setup_torch() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def load_data():
    """(Xtrain, ytrain, Xtest, ytest) as torch tensors: a fixed 80/20 split."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = np.random.RandomState(0).permutation(len(y))
    ntest = len(y) // 5
    te, tr = perm[:ntest], perm[ntest:]
    return x[tr], y[tr], x[te], y[te]


def make_model(seed: int = 0, hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def batches(n: int, batch: int, epoch: int, seed: int = 0):
    """The batches of an epoch: the same on every rank."""
    perm = np.random.RandomState(seed * 1000 + epoch).permutation(n)
    return [perm[i:i + batch] for i in range(0, n, batch)]


def rank_slice(idx: np.ndarray, rank: int, world: int) -> np.ndarray:
    return np.array_split(idx, world)[rank]


def rank_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """Mean cross-entropy over this rank's slice (the servers rescale the sum by 1/world)."""
    ii = torch.as_tensor(idx)
    return torch.nn.functional.cross_entropy(model(x[ii]), y[ii])


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


# ---- one trainer ----

def train(args) -> dict:
    setup_torch()
    client = rdmaps.Client(args.servers, timeout_ms=args.timeout_ms)   # rank/world from the launcher
    rank, world = client.rank, client.world_size
    print(f"trainer rank {rank} of {world} (launcher: {client.source})", flush=True)
    xtr, ytr, xte, yte = load_data()
    model = make_model(args.seed, args.hidden)
    opt = rdmaps.torch.DistributedOptimizer(
        model, client, prefix=args.prefix, mode=args.mode, staleness=args.staleness, optimizer="sgd",
        lr=args.lr, wire_dtype=args.wire, hooks=not args.no_hooks)
    history = []
    for epoch in range(args.epochs):
        total = comm0 = 0.0
        comm0 = opt.stats["comm_wait"]
        losses = []
        for idx in batches(len(ytr), args.batch, epoch, args.seed):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = rank_loss(model, xtr, ytr, rank_slice(idx, rank, world))
            loss.backward()
            opt.step()
            total += time.perf_counter() - t0
            losses.append(float(loss))
        comm = opt.stats["comm_wait"] - comm0
        acc = accuracy(model, xte, yte)
        rec = {"epoch": epoch + 1, "loss": float(np.mean(losses)), "acc": acc, "comm_share": comm / total,
               "step_ms": 1000 * total / len(losses)}
        history.append(rec)
        if rank == 0 and not args.quiet:
            print(f"epoch {epoch + 1:3d}  loss {rec['loss']:.4f}  test accuracy {acc:.4f}  "
                  f"step {rec['step_ms']:.2f} ms, {100 * rec['comm_share']:.1f}% waiting on communication",
                  flush=True)
    # the servers' final parameters: every rank done pushing, then one pull
    client.barrier()
    params = {}
    for s in opt._slots:
        s.tensor.pull(s.param.data.view(-1))
        params[s.name] = s.param.detach().numpy().copy()
    final_acc = accuracy(model, xte, yte)
    if rank == 0 and args.save:
        np.savez(args.save, **params)
    opt.close()
    client.close()
    res = {"rank": rank, "world": world, "source": client.source, "acc": final_acc, "history": history}
    if args.json:
        print("RESULT " + json.dumps(res), flush=True)
    return res


# ---- spawn mode: servers and trainers on this machine ----

def spawn(args) -> int:
    servers = None
    if not args.servers:
        servers = LocalServers(args.nservers, rdmapsd=args.rdmapsd)
        args.servers = servers.uris
        print(f"started {args.nservers} rdmapsd: {args.servers}", flush=True)
    try:
        rank_var, size_var = LAUNCHERS[args.launcher]
        procs = []
        for r in range(args.workers):
            env = {k: v for k, v in os.environ.items() if k not in ALL_LAUNCH_VARS}
            env.update({"RDMAPS_SERVERS": args.servers, rank_var: str(r), size_var: str(args.workers)})
            cmd = [sys.executable, os.path.abspath(__file__), "--worker"] + child_args(args)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        # one relay thread per trainer: whole lines, never interleaved
        lock = threading.Lock()

        def relay(p):
            for line in p.stdout:
                with lock:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
        relays = [threading.Thread(target=relay, args=(p,), daemon=True) for p in procs]
        for t in relays:
            t.start()
        rc = 0
        deadline = time.monotonic() + args.job_timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.returncode and not rc:
                rc = p.returncode
                for q in procs:          # one trainer failed: the others would wait for it
                    if q.poll() is None:
                        q.kill()
        for t in relays:
            t.join(10)
        return rc
    finally:
        if servers:
            servers.stop()


def child_args(args) -> list:
    out = ["--mode", args.mode, "--staleness", str(args.staleness), "--epochs", str(args.epochs),
           "--lr", str(args.lr), "--batch", str(args.batch), "--hidden", str(args.hidden),
           "--seed", str(args.seed), "--wire", args.wire, "--prefix", args.prefix,
           "--timeout-ms", str(args.timeout_ms)]
    if args.save:
        out += ["--save", os.path.abspath(args.save)]
    if args.no_hooks:
        out.append("--no-hooks")
    if args.quiet:
        out.append("--quiet")
    if args.json:
        out.append("--json")
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", help="use these rdmapsd (comma-separated URIs) instead of starting 2; "
                    "default $RDMAPS_SERVERS in --worker mode")
    ap.add_argument("--worker", action="store_true", help="be one trainer (rank/world from the launcher)")
    ap.add_argument("--workers", type=int, default=4, help="trainers to start (spawn mode, default 4)")
    ap.add_argument("--nservers", type=int, default=2, help="rdmapsd to start (spawn mode, default 2)")
    ap.add_argument("--rdmapsd", help="the rdmapsd binary (default: the build tree's, then PATH)")
    ap.add_argument("--launcher", choices=sorted(LAUNCHERS), default="rdmaps",
                    help="which launcher's variables the trainers get (spawn mode)")
    ap.add_argument("--mode", choices=["sync", "async", "bounded"], default="sync")
    ap.add_argument("--staleness", type=int, default=2, help="k of --mode bounded (default 2)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wire", choices=["f32", "bf16"], default="f32", help="gradient dtype on the wire")
    ap.add_argument("--no-hooks", action="store_true", help="push after backward, not from autograd hooks")
    ap.add_argument("--prefix", default="digits/", help="server tensor name prefix")
    ap.add_argument("--save", help="write the final parameters here (numpy .npz, rank 0)")
    ap.add_argument("--timeout-ms", type=int, default=30000)
    ap.add_argument("--job-timeout", type=float, default=600, help="spawn mode: kill trainers after this")
    ap.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    ap.add_argument("--json", action="store_true", help="each trainer ends with a line RESULT {json}")
    args = ap.parse_args(argv)
    if args.mode != "bounded":
        args.staleness = 0
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        train(args)
        return 0
    return spawn(args)


if __name__ == "__main__":
    sys.exit(main())
