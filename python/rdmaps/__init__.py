"""Python client of the rdmaps parameter server (help(rdmaps) is its manual).

SYNOPSIS
    import numpy as np, rdmaps

    with rdmaps.Client(servers="tcp://10.0.0.1:7000", rank=0, world_size=4) as c:
        w = c.tensor("model/w", 1024, dtype="f32", mode="sync",
                     optimizer="sgd", lr=0.5, rescale=1 / 4)
        w.push(np.ones(1024, np.float32))       # a gradient, by pointer
        params = w.pull()                       # fp32 parameters
        with w.push_start(grad) as req:         # non-blocking; waits on exit
            ...

DESCRIPTION
    This package binds librdmaps (rdmaps(3)) with ctypes, over its public
    C API only.  Servers (rdmapsd(8)) hold each tensor's parameters as fp32;
    a worker pushes gradients (fp32, bf16 or fp16) and pulls parameters
    (always fp32).  Consistency modes: "sync" (every worker's step-v
    gradient summed in rank order, then applied once), "bounded"
    (staleness k), "async" (each push applied alone).  Optimizers run on
    the servers: "sum" (p += rescale*g), "sgd", "momentum", "adam".

CLIENT
    Client(servers=None, rank=None, world_size=None, *, timeout_ms=None,
           key_file=None, insecure=None, verify=None, spin_us=None,
           takeover=None, staging_bytes=None)
    Every keyword left None keeps the C default of rps_client_opts_init()
    (timeout 30000 ms, no verify, ...).  servers, rank and world_size left
    None come from the environment through rps_client_opts_from_env():
    RDMAPS_SERVERS, then the first launcher found among RDMAPS_RANK/
    RDMAPS_WORLD_SIZE, RANK/WORLD_SIZE (torchrun), SLURM_PROCID/SLURM_NTASKS,
    OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE and PMI_RANK/PMI_SIZE.  With no
    launcher a process is rank 0 of 1.  Client.source names the winner
    ("caller", "rdmaps", "torchrun", "slurm", "openmpi", "pmi" or "none"),
    and the logger "rdmaps" says it at level DEBUG (the C library never
    logs).

TENSORS
    Client.tensor(name, count, dtype="f32", mode="sync", staleness=0,
                  optimizer="sum", lr=None, momentum=None, beta1=None,
                  beta2=None, eps=None, weight_decay=None, rescale=None,
                  init=None) -> Tensor
    creates the tensor, or opens it if it exists with the same options
    (rps_tensor_create): every worker may call it.  init (count fp32
    values) is kept from the first creator, so rank 0 creating first
    broadcasts its initial parameters.  Client.open(name) opens one.

    Tensor.push(grad), Tensor.pull(out=None) block; push_start and
    pull_start return a Request.  Tensor.info() gives the options.

BUFFERS (no copy)
    Arrays are passed to the library by pointer: numpy arrays
    (ndarray.ctypes.data) and torch CPU tensors (data_ptr()).  Nothing is
    ever converted or copied silently: a gradient of the wrong dtype raises
    TypeError, a non-contiguous one or one of the wrong number of elements
    raises ValueError.  Gradient dtypes: "f32" takes float32; "f16"
    float16; "bf16" takes torch.bfloat16 or, as numpy has no bfloat16,
    a uint16 array holding the bf16 bits.  Pull destinations are float32.
    CUDA tensors are refused here: rdmaps.torch stages them through pinned
    host memory.

REQUESTS
    Request.wait() waits and raises on failure; Request.test() returns True
    once done (raising if it failed); ``with`` waits on exit.  A request
    keeps its buffer alive until it completes; push buffers must not change
    meanwhile.  A request dropped unfinished is waited for on collection.

ERRORS
    Every failure of the library raises RdmapsError, a subclass of OSError:
    .errno is the positive errno (or rdmaps' own code: ESTALE_EPOCH,
    ELEASE) and .message rps_last_error()'s one line, read in the failing
    thread right after the call (rps_last_error is per thread).

THREADS
    The library is loaded with ctypes.CDLL, which releases the GIL around
    every C call: a push, pull, wait or barrier blocking in one thread lets
    the other Python threads run.  One Client may be shared by many threads.
    Close tensors and the client only when no other thread uses them.

ENVIRONMENT
    RDMAPS_LIBRARY   path of librdmaps.so to load (default: the build tree
                     this package sits in, then the system's, then
                     pkg-config's libdir)
    RDMAPS_SERVERS, RDMAPS_RANK, RDMAPS_WORLD_SIZE, RANK, WORLD_SIZE, ...
                     see CLIENT; RDMAPS_KEY_FILE, RDMAPS_INSECURE as in C.

SEE ALSO
    rdmaps.torch (DistributedOptimizer), rdmaps(3), rdmapsd(8), psctl(8)
"""
from __future__ import annotations

import ctypes
import errno as _errno
import logging
import math
import threading
import weakref
from typing import Any, Dict, Optional, Union

from . import _lib
from ._lib import ClientOpts, TensorOpts, lib

__all__ = ["Client", "Tensor", "Request", "RdmapsError", "version", "ESTALE_EPOCH", "ELEASE",
           "DTYPES", "MODES", "OPTIMIZERS"]

_log = logging.getLogger("rdmaps")

ESTALE_EPOCH = 10001
ELEASE = 10002

DTYPES = {"f32": 1, "bf16": 2, "f16": 3}
MODES = {"sync": 1, "bounded": 2, "async": 3}
OPTIMIZERS = {"sum": 1, "sgd": 2, "momentum": 3, "adam": 4}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_MODE_NAMES = {v: k for k, v in MODES.items()}
_OPT_NAMES = {v: k for k, v in OPTIMIZERS.items()}
_ESIZE = {"f32": 4, "bf16": 2, "f16": 2}
_DTYPE_ALIASES = {"float32": "f32", "fp32": "f32", "bfloat16": "bf16", "float16": "f16", "fp16": "f16",
                  "half": "f16"}


class RdmapsError(OSError):
    """A librdmaps call failed: errno (positive) and rps_last_error()'s line."""

    def __init__(self, err: int, message: str):
        super().__init__(err, message)
        self.message = message

    def __str__(self) -> str:
        return f"[{_errname(self.errno)}] {self.message}"


def _errname(err: int) -> str:
    if err == ESTALE_EPOCH:
        return "RPS_ESTALE_EPOCH"
    if err == ELEASE:
        return "RPS_ELEASE"
    return _errno.errorcode.get(err, str(err))


def _check(ret: int, what: str = "") -> int:
    """Raise RdmapsError for a negative return (reading this thread's message now)."""
    if ret < 0:
        msg = _lib.last_error()
        if not msg:
            m = lib.rps_strerror(ret)
            msg = (what + ": " if what else "") + (m.decode() if m else f"error {ret}")
        raise RdmapsError(-ret, msg)
    return ret


def version() -> str:
    """The library's "MAJOR.MINOR.PATCH"."""
    s = ctypes.c_char_p()
    lib.rps_version(ctypes.byref(s))
    return s.value.decode()


# ---- buffers: a pointer, never a copy ----------------------------------------------------

def _torch():
    import sys
    return sys.modules.get("torch")


def _describe(buf: Any) -> "tuple[int, int, str, int]":
    """(address, number of elements, element kind, bytes per element) of a
    numpy array or torch CPU tensor; raises for anything else, for
    non-contiguous memory, and for CUDA tensors.  Kinds: f32, f16, bf16, u16."""
    t = _torch()
    if t is not None and isinstance(buf, t.Tensor):
        if buf.device.type != "cpu":
            raise TypeError(f"rdmaps: a {buf.device.type} tensor: the C API takes host memory; "
                            "rdmaps.torch stages CUDA tensors through pinned host buffers")
        if not buf.is_contiguous():
            raise ValueError("rdmaps: the tensor is not contiguous (rdmaps never copies): "
                             "pass tensor.contiguous()")
        kinds = {t.float32: "f32", t.float16: "f16", t.bfloat16: "bf16"}
        kind = kinds.get(buf.dtype)
        if kind is None:
            raise TypeError(f"rdmaps: torch dtype {buf.dtype} is none of float32, float16, bfloat16")
        return buf.data_ptr(), buf.numel(), kind, buf.element_size()
    import numpy as np
    if isinstance(buf, np.ndarray):
        if not buf.flags["C_CONTIGUOUS"]:
            raise ValueError("rdmaps: the array is not C-contiguous (rdmaps never copies): "
                             "pass np.ascontiguousarray(a)")
        kinds = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint16): "u16"}
        kind = kinds.get(buf.dtype)
        if kind is None or not buf.dtype.isnative:
            raise TypeError(f"rdmaps: numpy dtype {buf.dtype} is none of float32, float16, "
                            "uint16 (bf16 bits) in native byte order")
        return buf.ctypes.data, buf.size, kind, buf.itemsize
    raise TypeError(f"rdmaps: {type(buf).__name__} is neither a numpy array nor a torch tensor")


def _grad_ptr(buf: Any, dtype: str, count: int) -> "tuple[int, int]":
    addr, n, kind, esize = _describe(buf)
    ok = kind == dtype or (dtype == "bf16" and kind == "u16")
    if not ok:
        want = {"f32": "float32", "f16": "float16", "bf16": "torch.bfloat16 or numpy uint16 (bf16 bits)"}[dtype]
        raise TypeError(f"rdmaps: the tensor's gradients are {dtype}: give {want}, not {kind}")
    if n != count:
        raise ValueError(f"rdmaps: {n} elements given, the tensor has {count}")
    return addr, n * esize


def _out_ptr(buf: Any, count: int) -> "tuple[int, int]":
    addr, n, kind, esize = _describe(buf)
    if kind != "f32":
        raise TypeError(f"rdmaps: pulls write fp32: give a float32 destination, not {kind}")
    if n != count:
        raise ValueError(f"rdmaps: a destination of {n} elements, the tensor has {count}")
    import numpy as np
    if isinstance(buf, np.ndarray) and not buf.flags["WRITEABLE"]:
        raise ValueError("rdmaps: the destination array is read-only")
    return addr, n * 4


# ---- requests ---------------------------------------------------------------------------

class Request:
    """A push or pull in flight (rps_push_start / rps_pull_start).

    Keeps its buffer (and tensor) alive until it completes.  ``wait()``
    blocks (GIL released) and raises RdmapsError if it failed; ``test()``
    returns False while it runs, True once it succeeded.  ``with`` waits on
    exit.  For a pull, ``result`` is the destination and ``version`` the
    lowest shard version read."""

    __slots__ = ("_req", "_buf", "_tensor", "_ver", "_status", "_msg", "_lock", "kind", "__weakref__")

    def __init__(self, req: ctypes.c_void_p, buf: Any, tensor: "Tensor", ver: Optional[ctypes.c_uint64],
                 kind: str):
        self._req = req
        self._buf = buf
        self._tensor = tensor
        self._ver = ver
        self._status: Optional[int] = None
        self._msg = ""
        self._lock = threading.Lock()
        self.kind = kind
        tensor._client._requests.add(self)

    @property
    def done(self) -> bool:
        return self._status is not None

    @property
    def result(self) -> Any:
        """The pull's destination (the push's gradient), once complete."""
        return self._buf

    @property
    def version(self) -> Optional[int]:
        return self._ver.value if self._ver is not None and self.done else None

    def _finish(self, status: int) -> None:
        self._status = status
        self._req = None
        self._tensor._client._requests.discard(self)
        if self.kind == "pull" and status == 0 and self._ver is not None:
            self._tensor.version = self._ver.value

    def _raise(self) -> None:
        if self._status:
            raise RdmapsError(-self._status, self._msg)

    def wait(self) -> Any:
        """Wait for completion; returns the pull's destination (or the push's gradient)."""
        with self._lock:
            if self._status is None:
                st = lib.rps_wait(self._req)
                self._msg = _lib.last_error() if st < 0 else ""
                self._finish(st)
        self._raise()
        return self._buf

    def test(self) -> bool:
        """True if complete (raising if it failed), False if still running."""
        with self._lock:
            if self._status is None:
                res = ctypes.c_int(0)
                r = lib.rps_test(self._req, ctypes.byref(res))
                if r < 0:
                    raise RdmapsError(-r, _lib.last_error())
                if r == 0:
                    return False
                self._msg = _lib.last_error() if res.value < 0 else ""
                if res.value < 0 and not self._msg:
                    self._msg = lib.rps_strerror(res.value).decode()
                self._finish(res.value)
        self._raise()
        return True

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.wait()
        else:
            try:
                self.wait()
            except RdmapsError:
                pass    # the body's exception is the one to see

    def __del__(self) -> None:
        # never let the library write into (or read from) freed memory
        if getattr(self, "_status", 0) is None and self._req:
            try:
                self.wait()
            except Exception:
                pass

    def __repr__(self) -> str:
        st = "running" if self._status is None else ("done" if self._status == 0 else f"failed {self._status}")
        return f"<rdmaps.Request {self.kind} {self._tensor.name!r} {st}>"


# ---- tensors ----------------------------------------------------------------------------

class Tensor:
    """A tensor on the servers (rps_tensor_t).  Made by Client.tensor/open."""

    def __init__(self, client: "Client", handle: ctypes.c_void_p, name: str):
        self._client = client
        self._h = handle
        self.name = name
        self.version: Optional[int] = None    # the lowest shard version of the last pull
        info = self.info()
        self.count: int = info["count"]
        self.dtype: str = info["dtype"]
        self.mode: str = info["mode"]

    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise ValueError(f"rdmaps: tensor {self.name!r} is closed")
        return self._h

    def info(self) -> Dict[str, Any]:
        """The tensor's options (rps_tensor_info) as a dict."""
        o = TensorOpts()
        lib.rps_tensor_opts_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        _check(lib.rps_tensor_info(self._handle(), ctypes.byref(o)))
        return {"count": o.count, "dtype": _DTYPE_NAMES.get(o.dtype, o.dtype),
                "mode": _MODE_NAMES.get(o.mode, o.mode), "staleness": o.staleness,
                "optimizer": _OPT_NAMES.get(o.optimizer, o.optimizer), "lr": o.lr, "momentum": o.momentum,
                "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps, "weight_decay": o.weight_decay,
                "rescale": o.rescale, "shards": lib.rps_tensor_shards(self._handle())}

    @property
    def clock(self) -> int:
        """The clock this worker's next push carries (rps_tensor_clock): sync,
        the step; bounded, the rank's pushes.  A replacement (takeover)
        starts at its predecessor's: compare it with the step it resumes at
        and skip what the predecessor already pushed."""
        c = ctypes.c_uint64(0)
        _check(lib.rps_tensor_clock(self._handle(), ctypes.byref(c)))
        return c.value

    def push(self, grad: Any) -> None:
        """Push a gradient (blocks, GIL released; the buffer may be reused on return)."""
        addr, nbytes = _grad_ptr(grad, self.dtype, self.count)
        _check(lib.rps_push(self._handle(), addr, nbytes))

    def pull(self, out: Any = None) -> Any:
        """Pull the fp32 parameters into out (a float32 array or tensor of
        count elements; a new numpy array if None) and return it.  Sync:
        waits for every worker's pushes up to this worker's last one."""
        if out is None:
            import numpy as np
            out = np.empty(self.count, np.float32)
        addr, nbytes = _out_ptr(out, self.count)
        ver = ctypes.c_uint64(0)
        _check(lib.rps_pull(self._handle(), addr, nbytes, ctypes.byref(ver)))
        self.version = ver.value
        return out

    def push_start(self, grad: Any) -> Request:
        """Start a push; the gradient must stay unchanged until the Request completes."""
        addr, nbytes = _grad_ptr(grad, self.dtype, self.count)
        req = ctypes.c_void_p()
        _check(lib.rps_push_start(self._handle(), addr, nbytes, ctypes.byref(req)))
        return Request(req, grad, self, None, "push")

    def pull_start(self, out: Any = None) -> Request:
        """Start a pull into out (allocated if None); Request.wait() returns it."""
        if out is None:
            import numpy as np
            out = np.empty(self.count, np.float32)
        addr, nbytes = _out_ptr(out, self.count)
        ver = ctypes.c_uint64(0)
        req = ctypes.c_void_p()
        _check(lib.rps_pull_start(self._handle(), addr, nbytes, ctypes.byref(ver), ctypes.byref(req)))
        return Request(req, out, self, ver, "pull")

    def close(self) -> None:
        """Release the handle (the tensor stays on the servers)."""
        if self._h:
            lib.rps_tensor_close(self._h)
            self._h = None
            self._client._tensors.discard(self)

    def __enter__(self) -> "Tensor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<rdmaps.Tensor {self.name!r} {self.count} x {self.dtype} {self.mode}>"


# ---- clients ----------------------------------------------------------------------------

def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        d = _DTYPE_ALIASES.get(dtype, dtype)
        if d in DTYPES:
            return d
        raise ValueError(f"rdmaps: dtype {dtype!r} is none of {sorted(DTYPES)}")
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        m = {t.float32: "f32", t.bfloat16: "bf16", t.float16: "f16"}
        if dtype in m:
            return m[dtype]
    import numpy as np
    try:
        nd = np.dtype(dtype)
        if nd == np.float32:
            return "f32"
        if nd == np.float16:
            return "f16"
    except TypeError:
        pass
    raise TypeError(f"rdmaps: dtype {dtype!r}: give 'f32', 'bf16' or 'f16'")


_INT_MAX = 2 ** 31 - 1


def _int_in(what: str, v: Any, lo: int, hi: int) -> int:
    """v as an int in [lo, hi], else ValueError (never wrapped into the C type)."""
    n = int(v)
    if not lo <= n <= hi:
        raise ValueError(f"rdmaps: {what} = {n} is outside {lo} to {hi}")
    return n


def _hyper(what: str, v: Any) -> float:
    """v as a finite float32, else ValueError (NaN, inf, or too large for fp32)."""
    f = float(v)
    if not math.isfinite(f) or not math.isfinite(ctypes.c_float(f).value):
        raise ValueError(f"rdmaps: {what} = {f!r} is not a finite float32")
    return f


def _name_bytes(name: str) -> bytes:
    """A tensor name for C: a NUL would cut it short there, so it is refused."""
    b = name.encode() if isinstance(name, str) else bytes(name)
    if b"\0" in b:
        raise ValueError(f"rdmaps: tensor name {name!r} holds a NUL byte")
    return b


class Client:
    """A connection to the servers of one cluster (rps_client_connect).

    Keywords left None keep rps_client_opts_init()'s defaults; servers,
    rank and world_size left None come from the environment
    (rps_client_opts_from_env: RDMAPS_SERVERS; RDMAPS_RANK/RDMAPS_WORLD_SIZE,
    torchrun's RANK/WORLD_SIZE, Slurm's, Open MPI's, PMI's), and with no
    launcher at all rank 0 of 1.  ``source`` says which launcher gave them.
    Every number is checked against its C type's range: a rank, world size,
    timeout, count or staleness outside it, a NaN or infinite (or beyond
    float32) hyper-parameter and a tensor name holding a NUL are a
    ValueError, never wrapped or cut short."""

    def __init__(self, servers: Optional[str] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, *, timeout_ms: Optional[int] = None,
                 key_file: Optional[str] = None, insecure: Optional[bool] = None,
                 verify: Optional[bool] = None, spin_us: Optional[int] = None,
                 takeover: Optional[bool] = None, staging_bytes: Optional[int] = None):
        self._h: Optional[ctypes.c_void_p] = None
        self._tensors: "weakref.WeakSet[Tensor]" = weakref.WeakSet()
        self._requests: "weakref.WeakSet[Request]" = weakref.WeakSet()
        o = ClientOpts()
        lib.rps_client_opts_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        keep = []       # the bytes the struct points to, alive through connect
        if servers is not None:
            keep.append(servers.encode())
            o.servers = keep[-1]
        # every int checked against its C type's range: ctypes would wrap
        # 2**32 + 1 into 1 without a word
        o.rank = -1 if rank is None else _int_in("rank", rank, 0, _INT_MAX - 1)
        o.num_workers = -1 if world_size is None else _int_in("world_size", world_size, 1, _INT_MAX)
        if timeout_ms is not None:
            o.timeout_ms = _int_in("timeout_ms", timeout_ms, 0, _INT_MAX)
        if verify is not None:
            o.verify = int(bool(verify))
        if spin_us is not None:
            o.spin_us = _int_in("spin_us", spin_us, 0, _INT_MAX)
        if takeover is not None:
            o.takeover = int(bool(takeover))
        if insecure is not None:
            o.insecure = int(bool(insecure))
        if staging_bytes is not None:
            o.staging_bytes = _int_in("staging_bytes", staging_bytes, 1, ctypes.c_size_t(-1).value)
        if key_file is not None:
            keep.append(str(key_file).encode())
            o.key_file = keep[-1]
        src = ctypes.c_char_p()
        _check(lib.rps_client_opts_from_env(ctypes.byref(o), ctypes.byref(src)))
        self.source: str = src.value.decode()
        if self.source == "none":       # no launcher: the C defaults, rank 0 of 1
            if o.rank < 0:
                o.rank = 0
            if o.num_workers < 1:
                o.num_workers = 1
        self.rank: int = o.rank
        self.world_size: int = o.num_workers
        self.servers: str = o.servers.decode()
        _log.debug("rank %d of %d from %s; servers %s", self.rank, self.world_size, self.source, self.servers)
        h = ctypes.c_void_p()
        _check(lib.rps_client_connect(ctypes.byref(o), ctypes.byref(h)))
        self._h = h

    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise ValueError("rdmaps: the client is closed")
        return self._h

    def tensor(self, name: str, count: int, dtype: Any = "f32", mode: str = "sync", staleness: int = 0,
               optimizer: str = "sum", lr: Optional[float] = None, momentum: Optional[float] = None,
               beta1: Optional[float] = None, beta2: Optional[float] = None, eps: Optional[float] = None,
               weight_decay: Optional[float] = None, rescale: Optional[float] = None,
               init: Any = None) -> Tensor:
        """Create the tensor, or open it if it exists with the very same
        options (rps_tensor_create).  Options left None keep the C defaults
        (lr 0.01, momentum 0.9, Adam 0.9/0.999/1e-8, no weight decay,
        rescale 1).  init: count fp32 values (numpy float32 or torch
        float32 CPU), kept from the first creator; every worker gives it or
        none does."""
        o = TensorOpts()
        lib.rps_tensor_opts_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        o.count = _int_in("count", count, 1, 2 ** 63)
        o.dtype = DTYPES[_dtype_name(dtype)]
        if mode not in MODES:
            raise ValueError(f"rdmaps: mode {mode!r} is none of {sorted(MODES)}")
        o.mode = MODES[mode]
        o.staleness = _int_in("staleness", staleness, 0, 2 ** 32 - 1)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"rdmaps: optimizer {optimizer!r} is none of {sorted(OPTIMIZERS)}")
        o.optimizer = OPTIMIZERS[optimizer]
        for k, v in (("lr", lr), ("momentum", momentum), ("beta1", beta1), ("beta2", beta2), ("eps", eps),
                     ("weight_decay", weight_decay), ("rescale", rescale)):
            if v is not None:
                setattr(o, k, _hyper(k, v))
        if init is not None:
            addr, _ = _out_ptr(init, int(count))
            o.init = ctypes.cast(addr, ctypes.POINTER(ctypes.c_float))
        h = ctypes.c_void_p()
        _check(lib.rps_tensor_create(self._handle(), _name_bytes(name), ctypes.byref(o), ctypes.byref(h)))
        del init    # only read during the call
        t = Tensor(self, h, name)
        self._tensors.add(t)
        return t

    def open(self, name: str) -> Tensor:
        """Open an existing tensor (RdmapsError ENOENT if no server holds it)."""
        h = ctypes.c_void_p()
        _check(lib.rps_tensor_open(self._handle(), _name_bytes(name), ctypes.byref(h)))
        t = Tensor(self, h, name)
        self._tensors.add(t)
        return t

    def barrier(self) -> None:
        """Wait until every worker entered the barrier (GIL released)."""
        _check(lib.rps_barrier(self._handle()))

    def close(self) -> None:
        """Wait for requests still running, close the tensors, disconnect."""
        if not self._h:
            return
        for r in list(self._requests):
            try:
                r.wait()
            except RdmapsError:
                pass
        for t in list(self._tensors):
            t.close()
        lib.rps_client_close(self._h)
        self._h = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"<rdmaps.Client rank {self.rank} of {self.world_size} ({self.source}) {self.servers!r}"
                f"{'' if self._h else ' closed'}>")
