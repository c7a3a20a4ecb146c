/* Status strings and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "lpx_internal.h"

static _Thread_local char last_error[1024];

const char *lpx_status_string(lpx_status s)
{
    switch (s) {
    case LPX_OK: return "LPX_OK: success";
    case LPX_EINVAL: return "LPX_EINVAL: invalid argument";
    case LPX_ENOMEM: return "LPX_ENOMEM: out of memory";
    case LPX_ENOTIMPL: return "LPX_ENOTIMPL: not implemented for this kind";
    case LPX_ENOTFOUND: return "LPX_ENOTFOUND: not found";
    case LPX_EEXIST: return "LPX_EEXIST: already registered";
    case LPX_ERANGE: return "LPX_ERANGE: out of range";
    case LPX_EDTYPE: return "LPX_EDTYPE: unsupported dtype";
    case LPX_ESHAPE: return "LPX_ESHAPE: shape mismatch";
    case LPX_EDEVICE: return "LPX_EDEVICE: device mismatch or unavailable";
    case LPX_ECOMM: return "LPX_ECOMM: collective failed";
    case LPX_ETIMEOUT: return "LPX_ETIMEOUT: timed out";
    case LPX_EPLUGIN: return "LPX_EPLUGIN: plugin error";
    case LPX_EABI: return "LPX_EABI: ABI version mismatch";
    case LPX_EIO: return "LPX_EIO: I/O error";
    case LPX_EFULL: return "LPX_EFULL: registry full";
    case LPX_ENUMERIC: return "LPX_ENUMERIC: non-finite value";
    case LPX_EINTERNAL: return "LPX_EINTERNAL: internal error";
    }
    return "unknown status";
}

const char *lpx_last_error(void) { return last_error; }

void lpx_clear_error(void) { last_error[0] = 0; }

lpx_status lpx_error(lpx_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

void lpx__assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "lpx: internal invariant broken: %s (%s:%d)\n", cond, file, line);
    abort();
}
