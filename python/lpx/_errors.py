"""The binding's exceptions (every failure is an LpxError)."""

# lpx_status codes the binding raises by itself (status.h's enum; lpx._ffi
# checks them against the loaded declarations when it loads liblpx)
_EINVAL, _ENOTFOUND, _ERANGE, _EDTYPE, _EPLUGIN = -1, -4, -6, -7, -12
_STATUS_NAMES = {"LPX_EINVAL": _EINVAL, "LPX_ENOTFOUND": _ENOTFOUND, "LPX_ERANGE": _ERANGE,
                 "LPX_EDTYPE": _EDTYPE, "LPX_EPLUGIN": _EPLUGIN}


class LpxError(RuntimeError):
    """An lpx call failed: .status is the lpx_status code, .message lpx's
    message (lpx_last_error), str() both. Every failure of this module is
    an LpxError; the subclasses below are also the Python exception a
    caller would catch for the same mistake."""

    def __init__(self, status, message):
        super().__init__(f"{message} (status {status})")
        self.status = status
        self.message = message


class LpxValueError(LpxError, ValueError):
    """A bad argument value (an unknown role or format name)."""


class LpxTypeError(LpxError, TypeError):
    """An argument of the wrong type (len() of a 0-d tensor, an index that
    is not an int or a slice)."""


class LpxIndexError(LpxError, IndexError):
    """An index out of range."""


class LpxLoadError(LpxError, OSError):
    """liblpx could not be loaded."""
