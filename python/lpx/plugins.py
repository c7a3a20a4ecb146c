"""Plugins: loading them (load_plugin), the wheel's bundled ones
(bundled_plugins), and lpx-cuda.so's stream entry points (cuda.h)."""
from . import _ffi
from ._errors import _EPLUGIN, LpxLoadError
from ._ffi import check as _check, load_library

# bundled plugins loaded with liblpx, in this order (lpx-mx-cuda and
# lpx-nccl need lpx-cuda); each declines politely where it cannot run.
# lpx-mpi.so is bundled but loaded only on request (load_plugin): it
# initializes MPI.
_AUTOLOAD = ("lpx-mx.so", "lpx-cuda.so", "lpx-mx-cuda.so", "lpx-nccl.so")


def bundled_plugins():
    """{file: "loaded" or the reason it was not} for the plugins bundled in
    this wheel and loaded with liblpx ({} outside a wheel, or when
    LPX_PLUGIN_PATH is set)."""
    load_library()
    return dict(_ffi._bundled_status)


def load_plugin(path):
    """Loads an lpx plugin (e.g. lpx-mx.so) by path."""
    lib = _ffi.L()
    out = _ffi.ffi.new("const lpx_plugin **")
    _check(lib.lpx_plugin_load(str(path).encode(), out))


_stream_fn = None
_stream_wait_fn = None


def _cuda_symbol(name):
    """lpx-cuda.so's symbol `name` (a void *), or LpxLoadError."""
    lib = _ffi.L()
    p = _ffi.ffi.new("const lpx_plugin **")
    if lib.lpx_plugin_find(b"cuda", p) != 0:
        lib.lpx_clear_error()
        raise LpxLoadError(_EPLUGIN, "lpx-cuda.so is not loaded (no GPU, or LPX_PLUGIN_PATH does not name it)")
    sym = lib.lpx_plugin_symbol(p[0], name.encode())
    if not sym:
        raise LpxLoadError(_EPLUGIN, f"lpx-cuda.so exports no {name}")
    return sym


def _cuda_plugin_symbol(name):
    """The address (an int) of lpx-cuda.so's symbol `name`."""
    return _ffi.addr(_cuda_symbol(name))


def _cuda_stream_wait(device, stream):
    """The consumer's `stream` waits for lpx's work on `device` (DLPack
    export; None: the legacy default stream)."""
    global _stream_wait_fn
    if _stream_wait_fn is None:
        _stream_wait_fn = _ffi.ffi.cast("lpx_cuda_stream_wait_fn", _cuda_symbol("lpx_cuda_stream_wait"))
    _check(_stream_wait_fn(int(device), _ffi.ffi.NULL if stream is None else _ffi.ffi.cast("void *", int(stream))))


def cuda_stream(device=0):
    """The CUDA stream (a cudaStream_t, as an int) on which lpx-cuda.so
    queues its work for `device`: order a framework's stream against it
    (lpx.torch does) so that neither reads the other's results early.
    Raises LpxLoadError when lpx-cuda.so is not loaded."""
    global _stream_fn
    if _stream_fn is None:
        _stream_fn = _ffi.ffi.cast("lpx_cuda_stream_fn", _cuda_symbol("lpx_cuda_stream"))
    return _ffi.addr(_stream_fn(int(device)))
