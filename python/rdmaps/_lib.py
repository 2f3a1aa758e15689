"""Loading librdmaps and declaring its C API for ctypes (internal).

Only the public API of rdmaps.h is used.  The option structs mirror the C
structs member for member; they are initialised by the library's
``rps_*_opts_init_sized`` with ``ctypes.sizeof`` of the mirror, so a library
that knows fewer members writes no byte past them and says so in ``size``.

The library is loaded with ``ctypes.CDLL`` (not ``PyDLL``): every foreign call
releases the GIL for its duration, so a blocking push, pull, wait or barrier
lets the other Python threads run.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import subprocess
from typing import Optional

__all__ = ["lib", "library_path", "ClientOpts", "TensorOpts"]


class ClientOpts(ctypes.Structure):
    """struct rps_client_opts (rdmaps.h), member for member."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("servers", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("num_workers", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
        ("verify", ctypes.c_int),
        ("spin_us", ctypes.c_int),
        ("takeover", ctypes.c_int),
        ("key_file", ctypes.c_char_p),
        ("insecure", ctypes.c_int),
        ("staging_bytes", ctypes.c_size_t),
    ]


class TensorOpts(ctypes.Structure):
    """struct rps_tensor_opts (rdmaps.h), member for member (enums are int)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("count", ctypes.c_uint64),
        ("dtype", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("staleness", ctypes.c_uint32),
        ("optimizer", ctypes.c_int),
        ("lr", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("rescale", ctypes.c_float),
        ("init", ctypes.POINTER(ctypes.c_float)),
    ]


def _candidates() -> list:
    env = os.environ.get("RDMAPS_LIBRARY")
    if env:
        return [env]        # asked for: that one or an error, never another
    out = []
    here = os.path.dirname(os.path.abspath(__file__))
    # the build tree: python/rdmaps/ -> ../../.libs (libtool's output, at the top)
    for base in (os.path.join(here, "..", ".."),):
        libs = os.path.join(base, ".libs")
        out += sorted(glob.glob(os.path.join(libs, "librdmaps.so*")))
    name = ctypes.util.find_library("rdmaps")
    if name:
        out.append(name)
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "rdmaps"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        if libdir:
            out += sorted(glob.glob(os.path.join(libdir, "librdmaps.so*")))
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _load() -> "tuple[ctypes.CDLL, str]":
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("rdmaps: librdmaps.so not found (set RDMAPS_LIBRARY to its path, install it with "
                      "`make install && ldconfig`, or build the tree this package sits in); tried: "
                      + ("; ".join(tried) or "nothing"))


lib, library_path = _load()

_p = ctypes.c_void_p
_pp = ctypes.POINTER(ctypes.c_void_p)
_sigs = {
    "rps_client_opts_init_sized": (None, [ctypes.POINTER(ClientOpts), ctypes.c_size_t]),
    "rps_tensor_opts_init_sized": (None, [ctypes.POINTER(TensorOpts), ctypes.c_size_t]),
    "rps_client_opts_from_env": (ctypes.c_int, [ctypes.POINTER(ClientOpts), ctypes.POINTER(ctypes.c_char_p)]),
    "rps_version": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p)]),
    "rps_client_connect": (ctypes.c_int, [ctypes.POINTER(ClientOpts), _pp]),
    "rps_client_close": (ctypes.c_int, [_p]),
    "rps_tensor_create": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.POINTER(TensorOpts), _pp]),
    "rps_tensor_open": (ctypes.c_int, [_p, ctypes.c_char_p, _pp]),
    "rps_tensor_info": (ctypes.c_int, [_p, ctypes.POINTER(TensorOpts)]),
    "rps_tensor_shards": (ctypes.c_uint32, [_p]),
    "rps_tensor_clock": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_uint64)]),
    "rps_tensor_close": (None, [_p]),
    "rps_push": (ctypes.c_int, [_p, _p, ctypes.c_size_t]),
    "rps_pull": (ctypes.c_int, [_p, _p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]),
    "rps_push_start": (ctypes.c_int, [_p, _p, ctypes.c_size_t, _pp]),
    "rps_pull_start": (ctypes.c_int, [_p, _p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64), _pp]),
    "rps_test": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_int)]),
    "rps_wait": (ctypes.c_int, [_p]),
    "rps_buffer_register": (ctypes.c_int, [_p, _p, ctypes.c_size_t, _pp]),
    "rps_buffer_deregister": (ctypes.c_int, [_p]),
    "rps_barrier": (ctypes.c_int, [_p]),
    "rps_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "rps_last_error": (ctypes.c_char_p, []),
}
for _name, (_res, _args) in _sigs.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def library_sizeof(struct: type) -> int:
    """The library's sizeof of an opts struct: its init sets ``size`` to
    min(the size given, its own sizeof), so give it room to spare."""
    buf = ctypes.create_string_buffer(ctypes.sizeof(struct) + 256)
    init = lib.rps_client_opts_init_sized if struct is ClientOpts else lib.rps_tensor_opts_init_sized
    init(ctypes.cast(buf, ctypes.POINTER(struct)), len(buf))
    return ctypes.c_size_t.from_buffer(buf).value


def last_error() -> str:
    """The calling thread's rps_last_error() line."""
    m: Optional[bytes] = lib.rps_last_error()
    return m.decode("utf-8", "replace") if m else ""
