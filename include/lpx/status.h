/* lpx — status codes and the thread-local error message.
 *
 * Every fallible lpx call returns an lpx_status: 0 on success, a negative
 * code on failure. On failure, lpx_last_error() holds a message naming the
 * op, the kind and the offending argument. */
#ifndef LPX_STATUS_H
#define LPX_STATUS_H

#include "export.h"

LPX_BEGIN_DECLS

typedef enum lpx_status {
    LPX_OK = 0,
    LPX_EINVAL = -1,      /* bad argument (NULL, out of range, bad schema) */
    LPX_ENOMEM = -2,      /* an allocation failed */
    LPX_ENOTIMPL = -3,    /* no kernel for this (op, key) and no fallback */
    LPX_ENOTFOUND = -4,   /* unknown name (op, kind, dtype, plugin) */
    LPX_EEXIST = -5,      /* duplicate registration */
    LPX_ERANGE = -6,      /* index/view out of range, size overflow */
    LPX_EDTYPE = -7,      /* dtype not supported or mismatched */
    LPX_ESHAPE = -8,      /* shapes do not match or broadcast */
    LPX_EDEVICE = -9,     /* device mismatch or unavailable device */
    LPX_ECOMM = -10,      /* a collective failed (peer error or exit) */
    LPX_ETIMEOUT = -11,   /* a collective or wait exceeded its timeout */
    LPX_EPLUGIN = -12,    /* a plugin failed to load or declined */
    LPX_EABI = -13,       /* ABI version mismatch */
    LPX_EIO = -14,        /* file or I/O error */
    LPX_EFULL = -15,      /* a fixed-capacity registry is full */
    LPX_ENUMERIC = -16,   /* NaN/inf where the op refuses them */
    LPX_EINTERNAL = -17   /* broken invariant inside lpx (a bug) */
} lpx_status;

/** Static, human-readable name of a status code ("LPX_EINVAL: invalid
 *  argument"). Never NULL; unknown codes give "unknown status". */
LPX_API const char *lpx_status_string(lpx_status s);

/** Message of the last failed lpx call on this thread ("" if none).
 *  The pointer stays valid until the next lpx call on the same thread. */
LPX_API const char *lpx_last_error(void);

/** Clears this thread's last error message. */
LPX_API void lpx_clear_error(void);

/** Sets this thread's error message (printf-style) and returns `s`.
 *  For kernels and plugins reporting failures; never fails. */
LPX_API lpx_status lpx_error(lpx_status s, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

LPX_END_DECLS

#endif
