/* The optimizer-state kinds (include/lpx/optim_state.h): what their files
 * share. */
#ifndef LPX_OS_INTERNAL_H
#define LPX_OS_INTERNAL_H

#include "../kind_author.h"
#include "../../core/numerics/optim_state.h"
#include "lpx/optim_state.h"

_Static_assert((int)LPX_OPTIM_STATE_8BIT == (int)LPX_OS_STATE_8BIT && (int)LPX_OPTIM_STATE_4BIT == (int)LPX_OS_STATE_4BIT &&
                   (int)LPX_OPTIM_STATE_FP8 == (int)LPX_OS_STATE_FP8,
               "the public formats are the numerics header's");
_Static_assert(LPX_OPTIM_STATE_BLOCK_MAX == LPX_OS_BLOCK_MAX, "one largest block");

enum { OS_CODES = 0, OS_SCALES = 1, OS_NINNER = 2 };

/* The registered kinds, by format (set once by lpx_optim_state_register_kinds). */
extern const lpx_kind *lpx__os_kinds[LPX_OPTIM_STATE_FORMATS];

/* The parts of a state tensor, read and checked (t of kind `kind`, the
 * metadata well formed): names op and arg in messages. */
typedef struct os_parts {
    lpx_optim_state_meta m;
    lpx_tensor *codes, *scales;
    int64_t numel, nblocks;
} os_parts;
lpx_status os_parts_of(const char *op, const char *arg, const lpx_tensor *t, os_parts *p);

extern const char *const lpx__os_kind_names[LPX_OPTIM_STATE_FORMATS];

/* The format of kind k, or -1 when k is not a state kind. */
int os_format_of_kind(const lpx_kind *k);

/* the codes of one moment: dtype and element count; the block count */
static inline lpx_dtype os_codes_dtype(int format, int role)
{
    return format == LPX_OPTIM_STATE_FP8 && role == LPX_OPTIM_STATE_V ? LPX_F16 : LPX_U8;
}
static inline int64_t os_codes_len(int format, int64_t numel, int64_t block)
{
    if (format != LPX_OPTIM_STATE_4BIT) return numel;
    return numel / block * (block / 2) + (numel % block + 1) / 2;
}
static inline int64_t os_nblocks(int64_t numel, int64_t block) { return numel / block + (numel % block != 0); }

/* Wraps codes and scales (references taken) into a state tensor of the
 * logical shape [ndim] on the codes' device. */
lpx_status os_make(int format, int role, int64_t block, int ndim, const int64_t *shape, lpx_tensor *codes,
                   lpx_tensor *scales, lpx_tensor **out);

/* The handlers of the state kinds (os_handlers.c; adamw_'s in os_adamw.c). */
lpx_status os_register_handlers(int key);
lpx_status os_register_adamw(int key);

#endif
