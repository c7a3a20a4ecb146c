/* Shared helpers of the CPU kernels: argument access, result handling,
 * broadcasting and strided f32 load/store in chunks. Kernels compute in
 * f32 (or double for reductions) whatever the storage dtype. */
#ifndef LPX_CPU_INTERNAL_H
#define LPX_CPU_INTERNAL_H

#include "../../core/lpx_internal.h"
#include "../../core/dtype_internal.h"

/* elements processed per chunk by the generic strided paths */
#define CPU_CHUNK 1024

/* kernel group registration (one per source file) */
lpx_status lpx_cpu_register_creation(void);
lpx_status lpx_cpu_register_views(void);
lpx_status lpx_cpu_register_elementwise(void);
lpx_status lpx_cpu_register_reduce(void);
lpx_status lpx_cpu_register_linalg(void);
lpx_status lpx_cpu_register_nn(void);
lpx_status lpx_cpu_register_float8(void);
lpx_status lpx_cpu_register_float8_mm(void);   /* float8_mm.c, called by the above */
lpx_status lpx_cpu_register_float8_transpose(void);
lpx_status lpx_cpu_register_float8_block(void);    /* float8_block.c */
lpx_status lpx_cpu_register_nf4(void);
lpx_status lpx_cpu_register_optim(void);
lpx_status lpx_cpu_register_rope(void);
lpx_status lpx_cpu_register_attention(void);

/* Registers a boxed CPU kernel; used by the group functions. */
static inline lpx_status cpu_reg(lpx_op op, lpx_kernel_fn fn)
{
    return lpx_kernel_register(op, LPX_KEY_CPU, fn, NULL);
}

/* Appends a result (takes over the caller's reference). */
static inline void cpu_ret(lpx_call *c, lpx_tensor *t)
{
    c->rets[c->nrets++] = lpx_v_tensor(t);
}

/* Name of the running op, for messages. */
static inline const char *cpu_op_name(const lpx_call *c) { return lpx_op_name(c->op); }

/* A tensor seen through a broadcast to `shape`: element (i0..in) of the
 * logical shape is at base + sum(i_k * strides[k]) (elements; broadcast
 * dims have stride 0). */
typedef struct cpu_view {
    int ndim;
    int64_t numel;
    int64_t shape[LPX_MAX_DIMS];
    int64_t strides[LPX_MAX_DIMS];
    char *base;            /* address of element 0 */
    lpx_dtype dtype;
    int elem_size;         /* bytes per element */
    bool contiguous;       /* strides are row-major over shape */
} cpu_view;

/* View t broadcast to (ndim, shape); t must be dense and broadcastable. */
void cpu_view_init(cpu_view *v, const lpx_tensor *t, int ndim, const int64_t *shape);
/* Plain view of t with its own shape. */
void cpu_view_of(cpu_view *v, const lpx_tensor *t);
/* Loads logical elements [start, start+n) as f32 into dst (n <= any). */
void cpu_load_f32(const cpu_view *v, int64_t start, int64_t n, float *dst);
/* Stores n f32 values into logical elements [start, start+n), encoding to
 * the view's dtype with `flags` (LPX_CONVERT_SATURATE or 0). */
void cpu_store_f32(const cpu_view *v, int64_t start, int64_t n, const float *src, unsigned flags);
/* f32 pointer if the view is contiguous f32, else NULL (fast paths). */
static inline float *cpu_view_f32(const cpu_view *v)
{
    return v->contiguous && v->dtype == LPX_F32 ? (float *)v->base : NULL;
}

/* Copies src into dst: element k of src's row-major order to element k of
 * dst's (same numel; src may be a broadcast view of dst's shape). Dtypes
 * convert like lpx_convert: a bit copy for equal dtypes, exact between
 * integer dtypes, one RNE rounding otherwise; `flags` 0 or
 * LPX_CONVERT_SATURATE. Byte-sized dtypes only; the two views must not
 * overlap in memory. (backends/cpu/views.c) */
lpx_status cpu_view_copy(const cpu_view *dst, const cpu_view *src, unsigned flags);

/* Philox4x32-10 (Salmon et al., SC'11), the counter-based generator behind
 * randn/rand: out = bijection_key(ctr). (backends/cpu/creation.c) */
void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Dense contiguous f32 copy of any dense tensor (retains t itself when it
 * already is one). */
lpx_status cpu_contiguous_f32(const lpx_tensor *t, lpx_tensor **out);

/* New contiguous CPU tensor; message names the op. */
lpx_status cpu_new(const lpx_call *c, lpx_dtype dtype, int ndim, const int64_t *shape, lpx_tensor **out);

/* The exact f32 value of each fp8 code (core/dtype_internal.h's tables):
 * the decode of the fp8 kernels (float8.c, float8_mm.c). */
/* The largest finite value a dequantization may write to dtype d (its max,
 * at most FLT_MAX: the product is an f32); lpx_f8_dequant_sat. */
static inline float cpu_f8_out_max(lpx_dtype d)
{
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    return t && t->max < 3.40282346638528859812e+38 ? (float)t->max : 3.40282346638528859812e+38f;
}

static inline const float *cpu_f8_decode_table(lpx_dtype d)
{
    return d == LPX_F8E4M3FN ? lpx__f8e4m3fn_table.f : lpx__f8e5m2_table.f;
}

#endif
