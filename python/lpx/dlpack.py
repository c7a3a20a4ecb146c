"""DLPack both ways: Tensor.__dlpack__'s capsules and from_dlpack.

The capsules are Python objects (PyCapsule), which cffi's ABI mode does
not reach: PyCapsule_New / GetPointer / IsValid / SetName are called
through ctypes.pythonapi, the one use of ctypes in the binding. Their
destructor is liblpx's C one (lpx_dlpack_capsule_destructor): a Python
destructor cannot run while a refusing consumer's exception is pending (it
then raised SystemError and leaked the tensor)."""
import ctypes as C
import sys

from . import _ffi
from ._errors import LpxError, LpxLoadError
from ._ffi import check as _check

_api = C.pythonapi
_api.PyCapsule_New.restype = C.py_object
_api.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_api.PyCapsule_GetPointer.restype = C.c_void_p
_api.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
_api.PyCapsule_IsValid.restype = C.c_int
_api.PyCapsule_IsValid.argtypes = [C.py_object, C.c_char_p]
_api.PyCapsule_SetName.restype = C.c_int
_api.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]

_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"


def _capsule_new(ptr, name):
    lib = _ffi.L()
    return _api.PyCapsule_New(ptr, name, _ffi.addr(lib.lpx_dlpack_capsule_destructor))


def _export(t, max_version):
    """The capsule of Tensor.__dlpack__ (its checks done): versioned when
    max_version >= (1, 0), else legacy."""
    lib = _ffi.lib
    if max_version is not None and tuple(max_version)[0] >= 1:
        out = _ffi.ffi.new("DLManagedTensorVersioned **")
        _check(lib.lpx_to_dlpack(t._h, out))
        return _capsule_new(_ffi.addr(out[0]), _VERSIONED)
    if t.readonly:
        raise BufferError("a read-only tensor cannot be exported as a legacy DLPack capsule "
                          "(pass max_version=(1, 0))")
    out = _ffi.ffi.new("DLManagedTensor **")
    _check(lib.lpx_to_dlpack_legacy(t._h, False, out))
    return _capsule_new(_ffi.addr(out[0]), _LEGACY)


def capsule_name(cap):
    """'dltensor_versioned', 'dltensor' (unconsumed), or None."""
    for name in (_VERSIONED, _LEGACY):
        if _api.PyCapsule_IsValid(cap, name):
            return name.decode()
    return None


def _consumer_stream(obj, stream):
    """The `stream` to pass to obj.__dlpack__: None for a producer off
    CUDA; for a CUDA producer the given stream, else lpx-cuda's stream of
    its device (None when lpx-cuda is not loaded: nothing of lpx's runs on
    that memory then)."""
    try:
        dev = obj.__dlpack_device__()
    except (AttributeError, TypeError):
        return None
    lib = _ffi.L()
    if int(dev[0]) not in (lib.kDLCUDA, lib.kDLCUDAManaged):
        return None
    if stream is not None:
        return int(stream)
    # through the package: lpx.cuda_stream is what a caller (or a test)
    # sees and may replace
    pkg = sys.modules[__package__]
    try:
        return pkg.cuda_stream(int(dev[1])) or None
    except LpxLoadError:
        return None


def from_dlpack(obj, *, stream=None):
    """Imports anything with __dlpack__ (numpy arrays, torch tensors, lpx
    tensors) or an unconsumed DLPack capsule, versioned or legacy, as an lpx
    Tensor, zero-copy. Asks producers for a versioned capsule first
    (max_version=(1, 1)) and falls back to the legacy protocol. The
    producer's memory is released when the last lpx view of it dies.

    On CUDA the handshake orders the producer's work before lpx's: lpx is
    the consumer, so it passes `stream=` to obj.__dlpack__ (lpx-cuda's
    stream of the tensor's device, or the `stream` given, a cudaStream_t as
    an int), and the producer makes that stream wait for the work it queued
    on its own (torch: an event on its current stream). Without it, lpx's
    kernels could read the memory before the producer has written it."""
    from .tensor import Tensor
    lib = _ffi.L()
    if hasattr(obj, "__dlpack__"):
        s = _consumer_stream(obj, stream)
        kw = {} if s is None else {"stream": s}
        try:
            cap = obj.__dlpack__(max_version=(1, 1), **kw)
        except TypeError:   # a producer that predates DLPack 1.0
            cap = obj.__dlpack__(**kw)
    else:
        cap = obj
    f = _ffi.ffi
    out = f.new("lpx_tensor **")
    if _api.PyCapsule_IsValid(cap, _VERSIONED):
        p = _api.PyCapsule_GetPointer(cap, _VERSIONED)
        _check(lib.lpx_from_dlpack(f.cast("DLManagedTensorVersioned *", p), out))
        _api.PyCapsule_SetName(cap, b"used_dltensor_versioned")  # lpx owns it now
    elif _api.PyCapsule_IsValid(cap, _LEGACY):
        p = _api.PyCapsule_GetPointer(cap, _LEGACY)
        _check(lib.lpx_from_dlpack_legacy(f.cast("DLManagedTensor *", p), out))
        _api.PyCapsule_SetName(cap, b"used_dltensor")
    else:
        raise LpxError(-1, "from_dlpack: not an unconsumed 'dltensor' or 'dltensor_versioned' capsule")
    return Tensor(out[0])
