"""lpx: a binding over liblpx (cffi, ABI mode, on its public headers).

liblpx.so is found through, in order: the LPX_LIBRARY environment variable
(a path to the .so), the copy bundled in the wheel (`pip install ./python`
builds and bundles liblpx and its plugins, and loads lpx-mx and the CUDA
plugins with it), a meson build directory next to the source tree
(build*/liblpx.so), then the system loader (ldconfig / LD_LIBRARY_PATH).

Tensors are refcounted handles: a Tensor owns one lpx reference and releases
it when garbage-collected or closed. numpy views, DLPack capsules and torch
tensors of it hold their own, so they stay valid after close(); a closed
handle (Tensor, safe_open, Float8Linear) raises LpxValueError when used.
load_file / safe_open copy tensors out of the file (docs/INTEROP.md,
"Lifetimes"). Errors raise LpxError(status, message) with
lpx_last_error().

The C declarations (structs, enums, signatures) are not written here:
cffi reads them from include/lpx/*.h, preprocessed at build time
(python/lpx/_cdefgen.py; lpx._ffi says where they are found).

DLPack: Tensor.__dlpack__ makes a versioned capsule ("dltensor_versioned",
DLManagedTensorVersioned, read-only flag included) when the consumer passes
max_version >= (1, 0), as NumPy >= 2.1 and PyTorch >= 2.3 do, and a legacy
"dltensor" capsule otherwise; lpx.from_dlpack(obj) takes either from
anything with __dlpack__, or a capsule itself. Zero-copy both ways.

Low precision: float8_quantize / float8_dequantize / float8_mm and
Float8Linear (float8.h), nf4_quantize / nf4_dequantize / nf4_linear and
qlora_linear (nf4.h). Files: save_file / load_file / safe_open
(safetensors.h), dense and kind tensors alike.

The modules, by job: _ffi (loading liblpx and its declarations), tensor
(Tensor, numpy), ops, float8, nf4, dlpack, safetensors, plugins; this
package re-exports their public names.
"""

from ._errors import LpxError, LpxIndexError, LpxLoadError, LpxTypeError, LpxValueError
from ._ffi import load_library
from .tensor import LPX_DEVICE_CPU, Tensor, dtype_names, from_numpy
from .ops import (add, cast, clone, div, kind_unflatten, matmul, mul, rmsnorm, rmsnorm_backward, sub, swiglu,
                  swiglu_backward)
from .dlpack import capsule_name, from_dlpack
from .float8 import (Float8Linear, Float8LinearCtx, Float8Recipe, float8_dequantize, float8_info, float8_linear,
                     float8_mm, float8_quantize)
from .nf4 import (nf4_dequantize, nf4_info, nf4_linear, nf4_linear_backward, nf4_quantize, qlora_linear,
                  qlora_linear_backward)
from .safetensors import load_file, safe_open, save_file
from .plugins import _cuda_plugin_symbol, bundled_plugins, cuda_stream, load_plugin

__all__ = ["LpxError", "LpxValueError", "LpxTypeError", "LpxIndexError", "LpxLoadError", "Tensor", "from_numpy",
           "from_dlpack", "load_library", "dtype_names", "sub", "mul", "div",
           "add", "matmul", "cast", "clone", "rmsnorm", "rmsnorm_backward", "swiglu", "swiglu_backward",
           "float8_quantize", "float8_dequantize", "float8_mm", "float8_info", "float8_linear", "Float8Linear",
           "Float8Recipe", "Float8LinearCtx", "kind_unflatten", "cuda_stream",
           "nf4_quantize", "nf4_dequantize", "nf4_info", "nf4_linear", "nf4_linear_backward",
           "qlora_linear", "qlora_linear_backward",
           "save_file", "load_file", "safe_open", "load_plugin", "bundled_plugins"]

# the public classes and functions keep the names they had when this
# package was one module (lpx.Tensor, not lpx.tensor.Tensor: reprs, pickles)
for _name in __all__ + ["capsule_name"]:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("lpx."):
        _obj.__module__ = __name__
del _name, _obj
