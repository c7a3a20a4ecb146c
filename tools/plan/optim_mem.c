/* Optimizer state and master bytes per rank for each --optim / --master
 * choice (optim_mem.h). */
#include <string.h>
#include "lpx/lpx.h"
#include "lpx/dtensor.h"
#include "lpx/optim_state.h"
#include "optim_mem.h"
#include "../../core/numerics/integer.h"
#include "../train/mem.h"

static const char *const optim_names[PL_OPTIMS] = {"adamw", "adamw8bit", "adamw4bit", "adamw-fp8"};
static const char *const master_names[PL_MASTERS] = {"f32", "bf16-sr", "f16-scaled", "f16-scaled-sr"};

const char *pl_optim_name(pl_optim o) { return o >= 0 && o < PL_OPTIMS ? optim_names[o] : "?"; }
const char *pl_master_name(pl_master m) { return m >= 0 && m < PL_MASTERS ? master_names[m] : "?"; }

int pl_optim_from_name(const char *s)
{
    for (int i = 0; s && i < PL_OPTIMS; i++)
        if (!strcmp(s, optim_names[i])) return i;
    return -1;
}

int pl_master_from_name(const char *s)
{
    for (int i = 0; s && i < PL_MASTERS; i++)
        if (!strcmp(s, master_names[i])) return i;
    return -1;
}

static lpx_optim_state_format format_of(pl_optim o)
{
    return o == PL_OPTIM_8BIT ? LPX_OPTIM_STATE_8BIT : o == PL_OPTIM_4BIT ? LPX_OPTIM_STATE_4BIT : LPX_OPTIM_STATE_FP8;
}

int64_t pl_optim_block(pl_optim o)
{
    if (o <= PL_OPTIM_ADAMW || o >= PL_OPTIMS) return 0;
    return lpx_optim_state_default_block(format_of(o));
}

int pl_master_bytes(pl_master m) { return m == PL_MASTER_F32 ? 4 : 2; }

int64_t pl_master_block(pl_optim o, pl_master m)
{
    if (m != PL_MASTER_F16S && m != PL_MASTER_F16S_SR) return 0;
    int64_t b = pl_optim_block(o);
    return b > 0 ? b : lpx_optim_state_default_block(LPX_OPTIM_STATE_8BIT); /* the engine's default block */
}

int64_t pl_master_total_bytes(pl_optim o, pl_master m, int64_t n)
{
    int64_t b = pl_master_block(o, m);
    return (int64_t)pl_master_bytes(m) * n + (b > 0 ? 4 * (n / b + (n % b != 0)) : 0);
}

int64_t pl_optim_state_bytes(pl_optim o, int64_t n)
{
    /* at most 8 bytes per element and 8 per block: n <= 2^59 keeps it in int64 */
    if (n < 0 || n > ((int64_t)1 << 59) || o < 0 || o >= PL_OPTIMS) return -1;
    if (o == PL_OPTIM_ADAMW) return 8 * n;
    int64_t block = pl_optim_block(o);
    if (block < 1) return -1;
    int64_t nb = n / block + (n % block != 0), scales = 4 * nb;
    switch (o) {
    case PL_OPTIM_8BIT: return 2 * (n + scales);                                      /* u8 m, u8 v */
    case PL_OPTIM_4BIT: return 2 * (n / block * (block / 2) + (n % block + 1) / 2 + scales); /* packed nibbles */
    case PL_OPTIM_FP8: return (n + scales) + (2 * n + scales);                        /* e4m3 m, f16 v */
    default: return -1;
    }
}

int64_t pl_optim_row_unit(pl_optim o, int64_t cols, int64_t base_unit)
{
    if (cols < 1 || base_unit < 1) return -1;
    int64_t block = pl_optim_block(o);
    if (block < 1) return base_unit;
    int64_t rows = lpx_rows_for_whole_blocks(cols, block);   /* a power of two <= 256 */
    return base_unit / lpx_gcd_i64(base_unit, rows) * rows;   /* lcm: base_unit is 1 or 128 */
}

/* adds rank's shard of a trainable [rows, cols] parameter cut in units of base_unit rows */
static int add_param(const char *who, int64_t rows, int64_t cols, int64_t base_unit, int world, int rank, pl_optim o,
                     pl_master m, pl_optim_mem *out)
{
    int64_t unit = pl_optim_row_unit(o, cols, base_unit), chunk, start, len, mb = pl_master_block(o, m);
    if (unit > 0 && mb > 0 && cols > 0) {
        /* a scaled f16 master's blocks whole on each rank too */
        int64_t r = lpx_rows_for_whole_blocks(cols, mb);
        unit = unit / lpx_gcd_i64(unit, r) * r;
    }
    if (unit < 1 || lpx_shard_range(rows, world, rank, unit, &chunk, &start, &len) != LPX_OK) return -1;
    if (len > 0 && cols > (((int64_t)1 << 59) / len))
        return lpx_error(LPX_ERANGE, "%s: a shard of %lld x %lld elements overflows", who, (long long)len,
                         (long long)cols), -1;
    int64_t n = len * cols, st = pl_optim_state_bytes(o, n);
    if (st < 0 || out->elems > ((int64_t)1 << 59) - n || out->state > INT64_MAX / 2 - st)
        return lpx_error(LPX_ERANGE, "%s: the optimizer state per rank overflows", who), -1;
    out->elems += n;
    out->state += st;
    out->master += pl_master_total_bytes(o, m, n);
    out->grads += 4 * n;
    return 0;
}

int pl_optim_mem_geom(const struct tr_geom *g, int recipe, int world, int rank, int lora_rank, pl_optim o,
                      pl_master m, pl_optim_mem *out)
{
    const char *who = "optimizer memory";
    memset(out, 0, sizeof *out);
    if (!g || world < 1 || rank < 0 || rank >= world || o < 0 || o >= PL_OPTIMS || m < 0 || m >= PL_MASTERS ||
        (recipe == TR_NF4_QLORA && lora_rank < 1))
        return lpx_error(LPX_EINVAL, "%s: world %d, rank %d, optimizer %d, master %d, LoRA rank %d out of range", who,
                         world, rank, (int)o, (int)m, lora_rank), -1;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        int rc = 0;
        if (recipe == TR_NF4_QLORA) {
            /* only the adapters train: A [r, cols], B [rows, r] (the frozen
             * base and the f32 embeddings, norms and head have no state) */
            if (P->kind != TR_P_LIN) continue;
            rc = add_param(who, lora_rank, P->cols, 1, world, rank, o, m, out);
            if (!rc) rc = add_param(who, P->rows, lora_rank, 1, world, rank, o, m, out);
        } else {
            int64_t base = recipe == TR_F8_BLOCKWISE && P->kind == TR_P_LIN ? 128 : 1;
            rc = add_param(who, P->rows, P->cols, base, world, rank, o, m, out);
        }
        if (rc) return -1;
    }
    return 0;
}

double pl_optim_step_bytes(const pl_optim_mem *x)
{
    if (!x || x->elems <= 0) return 0.0;
    return (2.0 * (double)x->master + 2.0 * (double)x->state + (double)x->grads) / (double)x->elems;
}

int pl_mem_apply_optim(const struct tr_geom *g, int recipe, int world, int lora_rank, pl_optim o, pl_master m,
                       tr_mem_est *e, pl_optim_mem *cur)
{
    pl_optim_mem base, c;
    if (pl_optim_mem_geom(g, recipe, world, 0, lora_rank, PL_OPTIM_ADAMW, PL_MASTER_F32, &base) ||
        pl_optim_mem_geom(g, recipe, world, 0, lora_rank, o, m, &c))
        return -1;
    /* tr_mem_estimate_geom counts f32 masters, f32 grad shards and f32 m + v
     * on the same shards as `base`: replace them by the choice's */
    e->params += c.master - base.master;
    e->grads += c.grads - base.grads;
    e->optimizer += c.state - base.state;
    if (cur) *cur = c;
    return 0;
}
