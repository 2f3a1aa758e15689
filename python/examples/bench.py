#!/usr/bin/env python3
"""Python beside C: push and pull through the rdmaps package vs the same
librdmaps calls made from a C loop, in one process, on one client, tensor
and buffer.

    python3 python/examples/bench.py [--servers LIST] [--rounds 7]

Without --servers it starts one rdmapsd on loopback (TCP).  The C loop
(bench_loop.c) is compiled here with cc against rdmaps.h and the library
the package loaded.  Tensors are async with the "sum" optimizer, so a push
waits for no other worker.  For each size it reports the median per call, the bandwidth and Python/C.  The
samples are paired (a C call, then a Python call, alternating which comes
first), so a shared machine's load drift hits both sides alike.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import rdmaps                       # noqa: E402
from rdmaps import _lib             # noqa: E402
from rdmaps.local import LocalServers   # noqa: E402


def build_loop(include: str) -> ctypes.CDLL:
    out = os.path.join(tempfile.mkdtemp(prefix="rdmaps-bench."), "bench_loop.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-I", include, os.path.join(HERE, "bench_loop.c"),
                    _lib.library_path, "-o", out], check=True)
    loop = ctypes.CDLL(out)
    loop.rps_bench_loop.restype = ctypes.c_double
    loop.rps_bench_loop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    return loop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--include", default=os.path.join(HERE, "..", "..", "include"))
    ap.add_argument("--sizes", default="4,1048576,16777216", help="bytes per call, comma-separated")
    args = ap.parse_args()
    loop = build_loop(args.include)
    srv = None
    if not args.servers:
        srv = LocalServers(1)
        args.servers = srv.uris
    try:
        c = rdmaps.Client(args.servers, rank=0, world_size=1)
        print(f"librdmaps {rdmaps.version()} ({_lib.library_path}), servers {args.servers}")
        print(f"{'op':4} {'bytes':>9} {'C us/call':>10} {'Py us/call':>10} {'C MB/s':>9} {'Py MB/s':>9} "
              f"{'Py/C bw':>7} {'Py-C us':>8}")
        for nbytes in (int(x) for x in args.sizes.split(",")):
            count = max(1, nbytes // 4)
            t = c.tensor(f"bench/{nbytes}/{os.getpid()}", count, mode="async")
            buf = np.ones(count, np.float32)
            n = 3000 if nbytes <= 4096 else max(20, int(1e9 // nbytes // args.rounds))
            for op in ("push", "pull"):
                pull = op == "pull"
                call = (lambda: t.pull(buf)) if pull else (lambda: t.push(buf))
                for _ in range(max(1, n // 10)):       # warm up
                    call()
                # paired samples: one C call, then one Python call, n times,
                # alternating which goes first, so a loaded machine's drift
                # hits both sides alike; medians of each side
                cs, ps = [], []
                h, addr, nb, pf = t._h, buf.ctypes.data, buf.nbytes, time.perf_counter
                for i in range(n * args.rounds):
                    if i % 2:
                        t0 = pf()
                        call()
                        ps.append(pf() - t0)
                    s = loop.rps_bench_loop(h, addr, nb, 1, int(pull))
                    if s < 0:
                        raise rdmaps.RdmapsError(int(-s), _lib.last_error())
                    cs.append(s)
                    if not i % 2:
                        t0 = pf()
                        call()
                        ps.append(pf() - t0)
                cm, pm = statistics.median(cs), statistics.median(ps)
                print(f"{op:4} {buf.nbytes:9d} {cm * 1e6:10.2f} {pm * 1e6:10.2f} {buf.nbytes / cm / 1e6:9.1f} "
                      f"{buf.nbytes / pm / 1e6:9.1f} {cm / pm:7.3f} {(pm - cm) * 1e6:8.2f}", flush=True)
            t.close()
        c.close()
    finally:
        if srv:
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
