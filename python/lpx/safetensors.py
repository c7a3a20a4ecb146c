"""safetensors files: save_file, load_file and safe_open (safetensors.h),
dense and kind tensors alike."""
import os

from . import _ffi
from ._errors import _EINVAL, LpxError, LpxValueError
from ._ffi import check as _check
from .ops import clone, kind_unflatten
from .tensor import Tensor, _t

def save_file(tensors, path, metadata=None):
    """Writes {name: Tensor or array} to `path` atomically (safetensors;
    kind tensors as their inner tensors plus a __metadata__ entry), with
    user `metadata` {str: str}."""
    lib, f = _ffi.L(), _ffi.ffi
    items = [(str(k), _t(v)) for k, v in tensors.items()]
    n = len(items)
    keep = [f.new("char[]", k.encode()) for k, _ in items]   # the strings live until the call returns
    names = f.new("const char *[]", keep or [f.NULL])
    handles = f.new("lpx_tensor *[]", [t._h for _, t in items] or [f.NULL])
    meta = [(f.new("char[]", str(k).encode()), f.new("char[]", str(v).encode())) for k, v in (metadata or {}).items()]
    kvs = f.new("lpx_safetensors_kv[]", [{"key": k, "value": v} for k, v in meta] or 1)
    _check(lib.lpx_safetensors_save(os.fsencode(path), n, names, handles, len(meta), kvs))


class safe_open:
    """An open safetensors file: keys(), get_tensor(name, quantize=None,
    copy=True), kind_of(name), metadata(). lpx maps the file (a private
    mapping) and get_tensor copies each tensor into memory of its own, so
    the tensors outlive the handle and do not depend on the file: rewriting
    or truncating it afterwards changes nothing they hold. copy=False skips
    the copy (zero-copy where the data is aligned): such a tensor shares the
    file's pages, sees later writes to the file, and reading it after the
    file is truncated kills the process (SIGBUS). A context manager; after
    close() every method raises LpxValueError."""

    def __init__(self, path):
        lib = _ffi.L()
        self._f = None
        self._path = os.fsdecode(path)
        out = _ffi.ffi.new("lpx_safetensors **")
        _check(lib.lpx_safetensors_open(os.fsencode(path), out))
        self._f = out[0]

    def _live(self):
        if not self._f:
            raise LpxValueError(_EINVAL, f"safe_open('{self._path}') is closed")
        return self._f

    def keys(self):
        f = self._live()
        lib = _ffi.lib
        return [_ffi.string(lib.lpx_safetensors_name(f, i)) for i in range(lib.lpx_safetensors_count(f))]

    def kind_of(self, name):
        k = _ffi.lib.lpx_safetensors_kind_of(self._live(), name.encode())
        if k == _ffi.NULL:
            raise KeyError(name)
        return _ffi.string(k) or None

    def get_tensor(self, name, quantize=None, copy=True):
        """Entry `name`, in memory of its own (copy=False: possibly a view
        of the file's pages, see the class); quantize='nf4' / 'float8' / a
        plugin kind reads a dense entry quantized on load (a new tensor
        either way)."""
        f = self._live()
        lib = _ffi.lib
        out = _ffi.ffi.new("lpx_tensor **")
        if quantize is None:
            _check(lib.lpx_safetensors_get(f, name.encode(), out))
        else:
            k = _ffi.ffi.new("const lpx_kind **")
            _check(lib.lpx_kind_find(str(quantize).encode(), k))
            _check(lib.lpx_safetensors_get_quantized(f, name.encode(), k[0], out))
        t = Tensor(out[0])
        # a dense entry quantized on load is new memory already; an entry
        # read as stored may be the mapping's pages
        if copy and (quantize is None or self.kind_of(name) == str(quantize)):
            t = _owned(t)
        return t

    def metadata(self):
        f = self._live()
        out = {}
        lib = _ffi.lib
        v = _ffi.ffi.new("const char **")
        for i in range(lib.lpx_safetensors_metadata_count(f)):
            k = lib.lpx_safetensors_metadata_at(f, i, v)
            out[_ffi.ffi.string(k).decode()] = _ffi.ffi.string(v[0]).decode()
        return out

    @property
    def closed(self):
        return not self._f

    def close(self):
        if self._f and _ffi.lib is not None:
            _ffi.lib.lpx_safetensors_close(self._f)
        self._f = None

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _owned(t):
    """t copied into memory of its own (lpx_clone; a kind tensor whose kind
    does not clone is rebuilt from copies of its inner tensors)."""
    try:
        return clone(t)
    except LpxError:
        if not t.kind:
            raise
    return kind_unflatten(t.kind, t.dtype, t.shape, [clone(x) for x in t.inner().values()], t.meta())


def load_file(path, copy=True):
    """{name: Tensor} of every entry of a safetensors file (kind tensors
    rebuilt: nf4, float8, plugin kinds when their plugin is loaded), each
    in memory of its own: independent of the file once loaded (copy=False:
    views of the file's pages where aligned, see safe_open)."""
    with safe_open(path) as f:
        return {k: f.get_tensor(k, copy=copy) for k in f.keys()}
