"""Finding and loading liblpx, and its declarations (cffi, ABI mode).

Nothing here mirrors C by hand: `ffi` is cffi's reading of the public
headers (python/lpx/_cdefgen.py makes it at build time from
include/lpx/*.h: structs, enums, integer #defines and every LPX_API
signature), and `lib` the library opened with it (ffi.dlopen).

liblpx.so is found through, in order: the LPX_LIBRARY environment variable
(a path to the .so), the copy bundled in the wheel, a meson build
directory next to the source tree (build*/liblpx.so), then the system
loader. The declarations are found beside it: liblpx_cffi.py in the
library's folder (a meson build writes it next to liblpx.so, the wheel
bundles it in lpx/_lib/) or in the share/lpx/ of its prefix (meson
install), else, in a source checkout, made now from include/ (needs cffi
and a C compiler), else the wheel's.
"""
import glob
import importlib.util
import os

from ._errors import _EPLUGIN, _STATUS_NAMES, LpxError, LpxLoadError

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))   # the source tree, in a checkout
# the wheel's bundled liblpx and plugins (python/meson.build)
_BUNDLED = os.path.join(_HERE, "_lib")
_CFFI_MODULE = "liblpx_cffi.py"

ffi = None   # cffi.FFI of the public headers, once load_library ran
lib = None   # the cffi library (ffi.dlopen of liblpx)
NULL = None  # ffi.NULL


def _find_library():
    """(path, bundled): LPX_LIBRARY, else the wheel's own copy, else a meson
    build directory of the source tree (build*/liblpx.so), else the system
    loader."""
    env = os.environ.get("LPX_LIBRARY")
    if env:
        return env, False
    mine = os.path.join(_BUNDLED, "liblpx.so.0")
    if os.path.exists(mine):
        return mine, True
    for cand in sorted(glob.glob(os.path.join(_ROOT, "build*", "liblpx.so"))):
        return cand, False
    return "liblpx.so.0", False


def _import_file(path):
    spec = importlib.util.spec_from_file_location("lpx._lpx_cffi", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi


def _declarations(libpath):
    """The cffi FFI of the headers liblpx at `libpath` was built from (see
    the module's docstring for where it is looked for)."""
    where = os.path.dirname(os.path.abspath(libpath)) if os.sep in libpath else None
    if where:
        for d in (where, os.path.join(where, "..", "share", "lpx"), os.path.join(where, "..", "..", "share", "lpx")):
            cand = os.path.join(d, _CFFI_MODULE)
            if os.path.exists(cand):
                return _import_file(cand)
    include = os.path.join(_ROOT, "include")
    if os.path.exists(os.path.join(include, "lpx", "lpx.h")):
        try:
            import cffi
            from . import _cdefgen
            text = _cdefgen.generate(os.environ.get("CC", "cc").split(),
                                     [include, os.path.join(_ROOT, "third_party", "dlpack", "include")])
            made = cffi.FFI()
            made.cdef(text)
            return made
        except Exception as e:  # noqa: BLE001 (no cffi, no compiler: said below)
            why = f"; making them from {include} failed: {e}"
    else:
        why = ""
    bundled = os.path.join(_BUNDLED, _CFFI_MODULE)
    if os.path.exists(bundled):
        return _import_file(bundled)
    raise LpxLoadError(_EPLUGIN, f"no declarations for liblpx at '{libpath}' ({_CFFI_MODULE} is written by the "
                                 f"meson build beside liblpx.so){why}")


class Library:
    """What load_library() returns: liblpx's functions and constants
    (cffi's, by name: lib.lpx_version()), with `ffi` (the declarations)
    and `_name` (the path it was loaded from)."""

    __slots__ = ("_lib", "_name", "ffi")

    def __init__(self, clib, name, f):
        self._lib, self._name, self.ffi = clib, name, f

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def __dir__(self):
        return dir(self._lib)

    def __repr__(self):
        return f"<lpx.Library '{self._name}'>"


_library = None
_bundled_status = {}
_on_load = []   # hooks run once liblpx is loaded (tables of header constants)


def load_library(path=None):
    """Loads liblpx (idempotent); returns it (a Library: cffi's functions
    and constants of the public headers, by name)."""
    global _library, ffi, lib, NULL
    if _library is not None:
        return _library
    where, bundled = (path, False) if path else _find_library()
    try:
        import _cffi_backend
    except ImportError:
        raise LpxLoadError(_EPLUGIN, "the lpx binding calls liblpx through cffi, which this Python lacks: "
                                     "pip install cffi (Debian: apt-get install python3-cffi)") from None
    try:
        # the library first (with no declarations), so that a wrong path is
        # said as such whatever else is missing
        _cffi_backend.FFI().dlopen(where)
        f = _declarations(where)
        clib = f.dlopen(where)
    except LpxLoadError:
        raise
    except OSError as e:
        raise LpxLoadError(_EPLUGIN, f"cannot load liblpx from '{where}' ({e}); build it (make) or point "
                                     "LPX_LIBRARY at liblpx.so") from None
    for name, value in _STATUS_NAMES.items():
        if getattr(clib, name) != value:
            raise LpxLoadError(_EPLUGIN, f"{name} is {getattr(clib, name)} in liblpx's headers, the binding "
                                         f"raises {value}: binding and library disagree")
    ffi, lib, NULL = f, clib, f.NULL
    _library = Library(clib, where, f)
    check(lib.lpx_init())
    for hook in _on_load:
        hook(lib)
    if bundled and "LPX_PLUGIN_PATH" not in os.environ:
        _load_bundled_plugins()
    return _library


def _load_bundled_plugins():
    """Loads the wheel's plugins (a caller who set LPX_PLUGIN_PATH chose the
    plugins, as for the lpx command); a decline (no GPU) is recorded, not
    raised: see bundled_plugins()."""
    from .plugins import _AUTOLOAD
    for name in _AUTOLOAD:
        p = os.path.join(_BUNDLED, name)
        if not os.path.exists(p):
            continue
        out = ffi.new("const lpx_plugin **")
        if lib.lpx_plugin_load(p.encode(), out) == 0:
            _bundled_status[name] = "loaded"
        else:
            _bundled_status[name] = last_error()
    lib.lpx_clear_error()


def L():
    """The cffi library, loaded on first use."""
    return lib if lib is not None else load_library()._lib


def string(p):
    """A C string (const char *) as str, or None for NULL."""
    return None if p == NULL else ffi.string(p).decode()


def last_error():
    return ffi.string(lib.lpx_last_error()).decode("utf-8", "replace")


def check(status):
    if status != 0:
        raise LpxError(status, last_error())


def addr(p):
    """A pointer's address as an int (0 for NULL)."""
    return int(ffi.cast("uintptr_t", p))

