/* Shared definitions of the float8 kind's source files (not installed).
 *
 * Payload: inner[0] data (dense fp8, logical shape, any strides),
 * inner[1] scale, inner[2] scale_inv (f32, [] or the keepdim shape), and
 * an f8_meta blob. The kind's code talks to tensors through the public
 * API and the dispatcher only (so the same code drives CPU and, later,
 * CUDA payloads); liblpx internals are used for allocation only. */
#ifndef LPX_FLOAT8_INTERNAL_H
#define LPX_FLOAT8_INTERNAL_H

#include "../kind_author.h"

#define F8_INNER_DATA 0
#define F8_INNER_SCALE 1
#define F8_INNER_SCALE_INV 2
#define F8_NINNER 3

#define F8_META_MAGIC 0x4B385046u   /* "FP8K" little-endian */
#define F8_META_VERSION 1u

/* Metadata blob of a float8 tensor: fixed-size fields, validated by
 * unflatten (it may come from an untrusted checkpoint). */
typedef struct f8_meta {
    uint32_t magic;        /* F8_META_MAGIC */
    uint16_t version;      /* F8_META_VERSION */
    uint8_t role;          /* lpx_float8_role */
    uint8_t granularity;   /* lpx_float8_granularity */
    int32_t axis;          /* AXISWISE: reduced dim, 0..ndim-1; TENSORWISE: -1; BLOCK: block rows */
    uint32_t reserved;     /* BLOCK: block columns; otherwise 0 */
} f8_meta;

_Static_assert(sizeof(f8_meta) == 16, "f8_meta is a 16-byte blob");

/* the kind handle (set by lpx_float8_register_kind) */
extern const lpx_kind *f8__kind;

static inline bool f8_is(const lpx_tensor *t) { return t && f8__kind && lpx_tensor_kind(t) == f8__kind; }
static inline const f8_meta *f8_meta_of(const lpx_tensor *t) { return (const f8_meta *)lpx_tensor_meta(t, NULL); }
static inline lpx_tensor *f8_data(const lpx_tensor *t) { return lpx_tensor_inner(t, F8_INNER_DATA); }
static inline lpx_tensor *f8_scale(const lpx_tensor *t) { return lpx_tensor_inner(t, F8_INNER_SCALE); }
static inline lpx_tensor *f8_scale_inv(const lpx_tensor *t) { return lpx_tensor_inner(t, F8_INNER_SCALE_INV); }

static inline f8_meta f8_meta_make(int role, int granularity, int axis)
{
    f8_meta m = {F8_META_MAGIC, (uint16_t)F8_META_VERSION, (uint8_t)role, (uint8_t)granularity,
                 granularity == LPX_FLOAT8_AXISWISE ? axis : -1, 0};
    return m;
}

/* The metadata of a BLOCK tensor of br x bc blocks. */
static inline f8_meta f8_meta_block(int role, int64_t br, int64_t bc)
{
    f8_meta m = {F8_META_MAGIC, (uint16_t)F8_META_VERSION, (uint8_t)role, (uint8_t)LPX_FLOAT8_BLOCK, (int32_t)br,
                 (uint32_t)bc};
    return m;
}
static inline bool f8_is_block(const lpx_tensor *t) { return f8_meta_of(t)->granularity == LPX_FLOAT8_BLOCK; }
static inline int64_t f8_block_rows(const f8_meta *m) { return m->axis; }
static inline int64_t f8_block_cols(const f8_meta *m) { return (int64_t)m->reserved; }

/* Builds a float8 tensor from trusted parts (retained): shape and device
 * from data. */
lpx_status f8_make(lpx_tensor *data, lpx_tensor *scale, lpx_tensor *scale_inv, lpx_dtype logical, const f8_meta *m,
                   lpx_tensor **out);

/* Checks parts as unflatten does (untrusted input); `what` prefixes
 * messages. Scale values are checked when they are on the CPU. */
lpx_status f8_validate(const char *what, lpx_dtype logical, int ndim, const int64_t *shape, lpx_tensor *const *inner,
                       int ninner, const void *meta, size_t meta_size);

/* Dequantizes float8 t into a dense tensor of dtype (LPX_FLOAT8_LOGICAL:
 * its logical dtype). */
lpx_status f8_dequantize(lpx_tensor *t, lpx_dtype dtype, lpx_tensor **out);

/* A dense tensor with t's values: t retained if dense, else dequantized to
 * its logical dtype. */
lpx_status f8_hp(lpx_tensor *t, lpx_tensor **out);

/* Scaled GEMM of float8 a [M, K] and b [K, N] (scales checked to be
 * constant along K); `op` names the caller in messages. */
lpx_status f8_gemm(const char *op, lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_dtype out_dtype,
                   unsigned flags, lpx_tensor **out);

/* Quantizes dense x (the core of lpx_float8_quantize); `op` names the
 * caller. */
lpx_status f8_quantize(const char *op, lpx_tensor *x, const lpx_float8_quant_opts *o, lpx_tensor **out,
                       lpx_float8_stats *stats);
/* f8_quantize, and with out_t the transposed copy from the same read
 * (fp8_quantize_t): x 2-D, tensorwise or scaled per row (axis 1); *out_t
 * is the float8 [R, C] of x's values stored column-major (x^T's bytes
 * contiguous), scaled per column (axis 0) when axiswise, else with *out's
 * scale. NULL out_t: f8_quantize. */
lpx_status f8_quantize2(const char *op, lpx_tensor *x, const lpx_float8_quant_opts *o, lpx_tensor **out,
                        lpx_tensor **out_t, lpx_float8_stats *stats);

/* A new float8 tensor equal to t with the inner tensors replaced by the
 * results of applying a view op: used by the view handlers. */
lpx_status f8_rewrap(const lpx_tensor *t, lpx_tensor *data, lpx_tensor *scale, lpx_tensor *scale_inv, int axis,
                     lpx_tensor **out);

/* The fallback kernel (float8_fallback.c). */
lpx_status f8_fallback(lpx_call *c);
/* Handler registration (float8_views.c, float8_gemm.c). */
lpx_status f8_register_view_handlers(int key);
lpx_status f8_register_gemm_handlers(int key);

/* Sharding hooks (float8_hooks.c). */
lpx_status f8_pre_all_gather(const lpx_tensor *shard, void *ctx, lpx_tensor **inputs, int *ninputs, void *meta,
                             size_t *meta_size);
lpx_status f8_post_all_gather(const lpx_kind *kind, lpx_tensor *const *outputs, int noutputs, const void *meta,
                              size_t meta_size, lpx_dtype param_dtype, lpx_tensor *out, lpx_tensor **result);

/* Releases up to n tensors (NULLs ignored). */
static inline void f8_release_all(lpx_tensor **ts, int n)
{
    for (int i = 0; i < n; i++) {
        lpx_tensor_release(ts[i]);
        ts[i] = NULL;
    }
}

/* Logical dtypes a float8 tensor may claim. */
static inline bool f8_logical_ok(lpx_dtype d) { return d == LPX_F32 || d == LPX_BF16 || d == LPX_F16; }
static inline bool f8_is_fp8(lpx_dtype d) { return d == LPX_F8E4M3FN || d == LPX_F8E5M2; }
/* The largest scale (and scale_inv) a tensor of logical dtype d may carry,
 * so both stay representable in d (0: no limit, f32); from the dtype
 * table, not a constant: f16's 65504, bf16's ~3.4e38 (never reached by
 * fp8_max / 1e-12). */
static inline double f8_scale_limit(lpx_dtype d)
{
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    return d == LPX_F32 || !t ? 0.0 : t->max;
}

#endif
