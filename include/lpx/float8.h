/* lpx — the float8 kind: fp8 tensors with scales, scaling recipes, scaled
 * GEMMs and Float8Linear.
 *
 * A float8 tensor is a kind tensor whose payload is three inner tensors
 *   [0] data       dense f8e4m3fn or f8e5m2, the logical shape (any strides:
 *                  a transposed float8 tensor holds a transposed view)
 *   [1] scale      f32: shape [] (tensorwise) or the logical shape with the
 *                  reduced ("axiswise") dim set to 1, e.g. [M, 1] rowwise
 *   [2] scale_inv  f32, same shape: (float)(1.0 / scale), what GEMMs use
 * plus metadata (GEMM role, granularity, axis). Its dtype is the logical
 * dtype (f32, bf16 or f16): what it dequantizes to. Conventions
 * (docs/NUMERICS.md): q = cast_fp8(x * scale), x ~ decode(q) * scale_inv.
 *
 * Dispatch handlers exist for matmul/linear/addmm (scaled fp8 GEMM), the
 * views transpose/t/view/reshape/slice/narrow (and so split/chunk), cast
 * (= dequantize), contiguous, clone, copy_ and detach. Other ops fail with
 * LPX_ENOTIMPL naming op and kind, unless the dequantize-and-redispatch
 * fallback is switched on (lpx_float8_set_fallback); LPX_TRACE counts the
 * calls that took it.
 *
 * All functions return an lpx_status (message in lpx_last_error()), hand
 * out new references through `out` pointers (set to NULL on failure), and
 * never abort on user error. */
#ifndef LPX_FLOAT8_H
#define LPX_FLOAT8_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "export.h"
#include "status.h"
#include "dtype.h"
#include "tensor.h"
#include "kind.h"

LPX_BEGIN_DECLS

/* What a float8 tensor is in a linear layer's GEMMs. NONE fits any role. */
typedef enum lpx_float8_role {
    LPX_FLOAT8_ROLE_NONE = 0,
    LPX_FLOAT8_ROLE_INPUT = 1,
    LPX_FLOAT8_ROLE_WEIGHT = 2,
    LPX_FLOAT8_ROLE_GRAD_OUTPUT = 3
} lpx_float8_role;

/* "The tensor's logical dtype", where a dtype argument allows it
 * (lpx_float8_dequantize, lpx_float8_mm). */
#define LPX_FLOAT8_LOGICAL ((lpx_dtype)-1)

/* One scale for the tensor, or one per slice along an axis. */
typedef enum lpx_float8_granularity {
    LPX_FLOAT8_TENSORWISE = 0,
    LPX_FLOAT8_AXISWISE = 1,  /* amax reduced over `axis`: scale has size 1 there */
    LPX_FLOAT8_BLOCK = 2      /* 2-D only: one scale per block_rows x block_cols block (DeepSeek-V3,
                                 TransformerEngine Float8BlockScaling: 1 x 128 for activations and
                                 gradients, 128 x 128 for weights); scale [ceil(R/br), ceil(C/bc)] */
} lpx_float8_granularity;

/* The block sides of the DeepSeek-V3 recipe. */
#define LPX_FLOAT8_BLOCK_SIZE 128

/* Where a scale comes from. */
typedef enum lpx_float8_scaling {
    LPX_FLOAT8_DYNAMIC = 0,   /* from this tensor's amax */
    LPX_FLOAT8_DELAYED = 1,   /* from an amax history (lpx_float8_delayed) */
    LPX_FLOAT8_STATIC = 2     /* given by the caller */
} lpx_float8_scaling;

/** Statistics of one quantization, for debugging fp8 numerics. */
typedef struct lpx_float8_stats {
    double amax;              /* max |x| (NaN if x holds NaN) */
    double scale;             /* the scale (axiswise: the smallest one) */
    double scale_max;         /* axiswise: the largest scale (tensorwise: = scale) */
    double underflow;         /* fraction of nonzero inputs that became +-0 */
    double saturation;        /* fraction of elements beyond the format's range
                                 (clamped, or NaN/inf when not saturating) */
    double nan;               /* fraction of NaN inputs */
    int64_t numel;
} lpx_float8_stats;

/* ---- delayed scaling (TransformerEngine recipe) -------------------- */

/* How the scale is derived from the amax history. */
typedef enum lpx_float8_amax_algo {
    LPX_FLOAT8_AMAX_MAX = 0,          /* max over the history window */
    LPX_FLOAT8_AMAX_MOST_RECENT = 1   /* the newest amax */
} lpx_float8_amax_algo;

/** Configuration of a delayed-scaling state. Zero fields take defaults. */
typedef struct lpx_float8_delayed_config {
    int history_len;   /* amaxes kept, 1..1048576; 0: 1024 */
    int algo;          /* lpx_float8_amax_algo */
    int margin;        /* scale = fp8_max / amax / 2^margin; 0..127 */
    int interval;      /* recompute the scale every `interval` updates; 0: 1 */
    lpx_dtype fp8;     /* format the scale is for; 0: f8e4m3fn */
} lpx_float8_delayed_config;

/** Caller-owned delayed-scaling state of one tensor: an amax history and
 *  the current scale (initially 1). Not thread-safe: one user at a time. */
typedef struct lpx_float8_delayed lpx_float8_delayed;

/** Creates a state (history zeros, scale 1). `cfg` may be NULL (defaults).
 *  Free with lpx_float8_delayed_free. Errors: LPX_EINVAL (a field out of
 *  range), LPX_EDTYPE (fp8 not an fp8 dtype), LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_delayed_new(const lpx_float8_delayed_config *cfg, lpx_float8_delayed **out);
/** Frees a state. NULL is ignored. */
LPX_API void lpx_float8_delayed_free(lpx_float8_delayed *d);
/** Records `amax` (|amax| of one cast) as the newest history entry, the
 *  oldest one dropping out, and on every `interval`-th update recomputes
 *  scale = fp8_max / a / 2^margin, a = max over the history (NaN or inf
 *  in it propagate) or the newest amax; the previous scale is kept when a
 *  is 0 or not finite. Errors: LPX_EINVAL (NULL, negative amax). */
LPX_API lpx_status lpx_float8_delayed_update(lpx_float8_delayed *d, double amax);
/** The scale the next cast uses (0 for NULL). */
LPX_API float lpx_float8_delayed_scale(const lpx_float8_delayed *d);
/** Number of updates so far (0 for NULL). */
LPX_API int64_t lpx_float8_delayed_steps(const lpx_float8_delayed *d);
/** The configuration (defaults resolved) into *cfg. Errors: LPX_EINVAL. */
LPX_API lpx_status lpx_float8_delayed_get_config(const lpx_float8_delayed *d, lpx_float8_delayed_config *cfg);
/** Copies the history, newest first, into out[0..min(cap, len)) and returns
 *  the number copied (0 on NULL arguments). */
LPX_API int lpx_float8_delayed_history(const lpx_float8_delayed *d, float *out, int cap);
/** Serializes the state (config, steps, scale, history) into buf, a
 *  versioned little-endian blob. *size receives the bytes needed; with
 *  buf == NULL or cap < *size nothing is written and LPX_ERANGE is
 *  returned (except for the query buf == NULL, cap == 0: LPX_OK). */
LPX_API lpx_status lpx_float8_delayed_save(const lpx_float8_delayed *d, void *buf, size_t cap, size_t *size);
/** Restores a blob written by lpx_float8_delayed_save into d (its config
 *  included). The blob is untrusted: every field is checked, and on any
 *  error d is unchanged. Errors: LPX_EINVAL (bad blob, with the field),
 *  LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_delayed_load(lpx_float8_delayed *d, const void *buf, size_t size);

/* ---- quantize, wrap, inspect ----------------------------------------- */

/** Options of lpx_float8_quantize. Zero-initialized = dynamic tensorwise
 *  e4m3fn, saturating, role NONE. */
typedef struct lpx_float8_quant_opts {
    size_t struct_size;            /* sizeof(lpx_float8_quant_opts); 0 is accepted as this size */
    lpx_dtype fp8;                 /* LPX_F8E4M3FN (also when 0) or LPX_F8E5M2 */
    int granularity;               /* lpx_float8_granularity */
    int axis;                      /* AXISWISE: the reduced dim; negative counts from the end
                                      (-1 = rowwise: one scale per row of a 2-D tensor) */
    int role;                      /* lpx_float8_role recorded in the result */
    bool pow2_scale;               /* dynamic scales rounded down to a power of two */
    bool nonsaturating;            /* overflow -> NaN (e4m3fn) / inf (e5m2) instead of +-max */
    const lpx_tensor *scale;       /* static scaling: f32 scale (numel 1, or the keepdim shape) */
    lpx_float8_delayed *delayed;   /* delayed scaling (tensorwise): cast with its scale, then record the amax */
    /* appended later (read only when struct_size covers them) */
    int block_rows, block_cols;    /* BLOCK: the block sides; 0 and 0: by role, 128 x 128 for a
                                      weight, else 1 x 128 (along the last dim) */
} lpx_float8_quant_opts;

/** Quantizes dense x (f32, bf16 or f16: the logical dtype) into a new
 *  float8 tensor in one fused call (amax, scale, cast; two passes over x
 *  for dynamic scaling, one for static/delayed). Dynamic scales follow
 *  docs/NUMERICS.md (fp8_max / max(amax, 1e-12), optional power of 2), clamped to
 *  65504 when x is f16 so that scale and scale_inv are f16-representable;
 *  delayed scales are clamped the same way; static scales are used as
 *  given. `opts` may be NULL (defaults); `stats` may be NULL. With a
 *  delayed state, the amax of x is recorded into it after the cast.
 *  Errors: LPX_EINVAL (NULL x/out, x already float8, bad option, both a
 *  static scale and a delayed state), LPX_EDTYPE, LPX_ESHAPE (static scale
 *  shape), LPX_ENUMERIC (dynamic scaling of a group holding NaN/inf),
 *  LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_quantize(lpx_tensor *x, const lpx_float8_quant_opts *opts, lpx_tensor **out,
                                       lpx_float8_stats *stats);

/** Wraps existing fp8 data and its scale (both retained, not copied) into
 *  a float8 tensor; scale_inv is computed. data: dense f8e4m3fn/f8e5m2;
 *  scale: f32, [] (tensorwise: numel-1 shapes are reshaped) or data's
 *  shape with `axis` set to 1 (axiswise), finite and > 0. logical_dtype:
 *  f32, bf16 or f16. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE, LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_from_data(lpx_tensor *data, lpx_tensor *scale, lpx_dtype logical_dtype, int role,
                                        int granularity, int axis, lpx_tensor **out);

/** Description of a float8 tensor. */
typedef struct lpx_float8_info {
    lpx_dtype fp8;           /* dtype of the data */
    lpx_dtype logical;       /* the tensor's dtype */
    int role;                /* lpx_float8_role */
    int granularity;         /* lpx_float8_granularity */
    int axis;                /* AXISWISE: the reduced dim (>= 0); TENSORWISE and BLOCK: -1
                                (lpx_float8_block_shape gives a BLOCK tensor's blocks) */
} lpx_float8_info;

/** The block sides of a BLOCK float8 tensor into *block_rows and
 *  *block_cols (either may be NULL). Errors: LPX_EINVAL (not float8, or
 *  not blockwise). */
LPX_API lpx_status lpx_float8_block_shape(const lpx_tensor *t, int64_t *block_rows, int64_t *block_cols);

/* Typed calls of the blockwise dense ops (ops.def, "blockwise fp8");
 * outputs may be NULL except q / out. */
/** fp8_quantize_block: x 2-D -> q, scale and scale_inv [ceil(R/br),
 *  ceil(C/bc)], stats f32 [4]. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ESHAPE,
 *  LPX_ENUMERIC (a block holding NaN/inf), LPX_ENOMEM. */
LPX_API lpx_status lpx_fp8_quantize_block(lpx_tensor *x, lpx_dtype fp8, int64_t block_rows, int64_t block_cols,
                                          bool pow2, bool saturate, lpx_tensor **q, lpx_tensor **scale,
                                          lpx_tensor **scale_inv, lpx_tensor **stats);
/** fp8_dequantize_block: decode(q) * its block's scale_inv, in dtype. */
LPX_API lpx_status lpx_fp8_dequantize_block(lpx_tensor *q, lpx_tensor *scale_inv, int64_t block_rows,
                                            int64_t block_cols, lpx_dtype dtype, lpx_tensor **out);
/** fp8_mm_block: a [M, K] @ b [K, N] with per-K-block promotion (see
 *  ops.def); bias may be NULL. */
LPX_API lpx_status lpx_fp8_mm_block(lpx_tensor *a, lpx_tensor *a_scale_inv, int64_t a_block_rows,
                                    int64_t a_block_cols, lpx_tensor *b, lpx_tensor *b_scale_inv,
                                    int64_t b_block_rows, int64_t b_block_cols, lpx_tensor *bias, lpx_dtype out_dtype,
                                    lpx_tensor **out);

/** The float8 kind (registered by lpx_init), or NULL before init. */
LPX_API const lpx_kind *lpx_float8_kind(void);
/** True if t is a float8 tensor. */
LPX_API bool lpx_float8_is(const lpx_tensor *t);
/** Fills *info for a float8 tensor. Errors: LPX_EINVAL (NULL, not float8). */
LPX_API lpx_status lpx_float8_get_info(const lpx_tensor *t, lpx_float8_info *info);
/** The fp8 data of a float8 tensor (borrowed, valid while t lives; may be
 *  a strided view), or NULL if t is not float8. */
LPX_API lpx_tensor *lpx_float8_data(const lpx_tensor *t);
/** The f32 scale (q = cast(x * scale)) of a float8 tensor, shape [] or
 *  keepdim (borrowed), or NULL if t is not float8. */
LPX_API lpx_tensor *lpx_float8_scale(const lpx_tensor *t);
/** The f32 scale_inv (x ~ decode(q) * scale_inv) of a float8 tensor,
 *  same shape as the scale (borrowed), or NULL if t is not float8. */
LPX_API lpx_tensor *lpx_float8_scale_inv(const lpx_tensor *t);

/** Dequantizes a float8 tensor into a new dense contiguous tensor of
 *  `dtype` (LPX_FLOAT8_LOGICAL = its logical dtype): decode(q) * scale_inv
 *  in f32, rounded once. Dense t: a cast. Errors: LPX_EINVAL, LPX_EDTYPE, LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_dequantize(lpx_tensor *t, lpx_dtype dtype, lpx_tensor **out);

/** Scaled fp8 GEMM of two float8 tensors a [M, K] and b [K, N]:
 *  a's scales tensorwise or per row ([M, 1]), b's tensorwise or per column
 *  ([1, N]); optional dense bias [N]; out_dtype f32, bf16 or f16
 *  (LPX_FLOAT8_LOGICAL: a's logical dtype). e5m2 x e5m2 is refused. Errors: LPX_EINVAL, LPX_EDTYPE,
 *  LPX_ESHAPE (K mismatch, scales along K, layout), LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_mm(lpx_tensor *a, lpx_tensor *b, lpx_tensor *bias, lpx_dtype out_dtype,
                                 lpx_tensor **out);

/** Switches the float8 "dequantize and redispatch" fallback on or off
 *  (default off). When on, an op without a float8 handler runs on the
 *  dequantized (logical dtype) tensors and returns dense results; in-place
 *  ops and `out` arguments that are float8 are written back requantized
 *  with their own scales. LPX_TRACE shows each such call in the
 *  "fallbacks" column. Errors: from the registry (LPX_ENOMEM). */
LPX_API lpx_status lpx_float8_set_fallback(bool enable);
/** True if the fallback is on. */
LPX_API bool lpx_float8_fallback_enabled(void);

/* ---- typed calls of the dense ops (ops_float8.def) -------------------- */

/** fp8_quantize on dense tensors (see ops_float8.def for the exact
 *  semantics). scale NULL: dynamic; dim NULL: tensorwise, else the reduced
 *  dim. q, scale_out, scale_inv and stats receive new references (any of
 *  the last three may be NULL to drop it). */
LPX_API lpx_status lpx_fp8_quantize(lpx_tensor *x, lpx_tensor *scale, lpx_dtype fp8, const int64_t *dim, bool pow2,
                                    double scale_max, bool saturate, lpx_tensor **q, lpx_tensor **scale_out,
                                    lpx_tensor **scale_inv, lpx_tensor **stats);
/** fp8_quantize_t (ops_float8.def): quantize a 2-D x [R, C] and, from the
 *  same read, x^T [C, R] (contiguous), for GEMMs that read both
 *  orientations. q, scale_out, scale_inv, stats as lpx_fp8_quantize with
 *  dim 1 when axiswise (else tensorwise); qt, scale_t, scale_inv_t: x^T's
 *  codes and its scales (axiswise: [C, 1], one per column of x;
 *  tensorwise: q's scale), allocated on x's device. Every output receives
 *  a new reference; any of scale_out, scale_inv, stats, scale_t and
 *  scale_inv_t may be NULL to drop it. Errors as lpx_fp8_quantize, plus
 *  LPX_ESHAPE for x that is not 2-D and LPX_EINVAL for a static scale with
 *  axiswise. */
LPX_API lpx_status lpx_fp8_quantize_t(lpx_tensor *x, lpx_tensor *scale, lpx_dtype fp8, bool axiswise, bool pow2,
                                      double scale_max, bool saturate, lpx_tensor **q, lpx_tensor **scale_out,
                                      lpx_tensor **scale_inv, lpx_tensor **stats, lpx_tensor **qt,
                                      lpx_tensor **scale_t, lpx_tensor **scale_inv_t);
/** fp8_dequantize: decode(q) * scale_inv as a new tensor of dtype. */
LPX_API lpx_status lpx_fp8_dequantize(lpx_tensor *q, lpx_tensor *scale_inv, lpx_dtype dtype, lpx_tensor **out);
/** fp8_scaled_mm on dense fp8 matrices; bias may be NULL. */
LPX_API lpx_status lpx_fp8_scaled_mm(lpx_tensor *a, lpx_tensor *a_scale_inv, lpx_tensor *b, lpx_tensor *b_scale_inv,
                                     lpx_tensor *bias, lpx_dtype out_dtype, lpx_tensor **out);
/** Flags of lpx_fp8_scaled_mm_ex. FAST_ACCUM: the device may accumulate
 *  without promoting partial sums to f32 (ops_float8.def). */
enum { LPX_FP8_MM_FAST_ACCUM = 1 };
/** lpx_fp8_scaled_mm with flags (LPX_FP8_MM_*); unknown bits: LPX_EINVAL. */
LPX_API lpx_status lpx_fp8_scaled_mm_ex(lpx_tensor *a, lpx_tensor *a_scale_inv, lpx_tensor *b, lpx_tensor *b_scale_inv,
                                        lpx_tensor *bias, lpx_dtype out_dtype, unsigned flags, lpx_tensor **out);
/** fp8_scale_from_amax: the dynamic scale formula on given amaxes. */
LPX_API lpx_status lpx_fp8_scale_from_amax(lpx_tensor *amax, lpx_dtype fp8, bool pow2, double scale_max,
                                           lpx_tensor **scale, lpx_tensor **scale_inv);

/* ---- Float8Linear ----------------------------------------------------- */

/* How one of the three GEMMs of a linear layer runs. */
typedef enum lpx_float8_gemm_mode {
    LPX_FLOAT8_GEMM_FP8 = 0,             /* quantize operands, scaled fp8 GEMM */
    LPX_FLOAT8_GEMM_HIGH_PRECISION = 1,  /* logical-dtype GEMM, no quantization */
    LPX_FLOAT8_GEMM_FAKE_QUANT = 2       /* quantize-dequantize, then logical-dtype GEMM */
} lpx_float8_gemm_mode;

/** Cast of one GEMM operand. AXISWISE means one scale per row of the GEMM's
 *  A operand / per column of its B operand (along the dim that is not
 *  contracted), which is what a GEMM epilogue can apply. */
typedef struct lpx_float8_operand_config {
    lpx_dtype dtype;       /* LPX_F8E4M3FN or LPX_F8E5M2 */
    int granularity;       /* lpx_float8_granularity */
    int scaling;           /* LPX_FLOAT8_DYNAMIC or LPX_FLOAT8_DELAYED (tensorwise only) */
    bool pow2_scale;       /* dynamic scales rounded down to powers of two */
} lpx_float8_operand_config;

typedef struct lpx_float8_gemm_config {
    int mode;                          /* lpx_float8_gemm_mode */
    lpx_float8_operand_config a, b;    /* used in FP8 and FAKE_QUANT modes */
} lpx_float8_gemm_config;

/** A Float8Linear recipe: out = x @ W^T (+ b), grad_x = g @ W,
 *  grad_W = g^T @ x, each GEMM configured on its own. Get one from
 *  lpx_float8_linear_recipe_preset and override fields to debug. */
typedef struct lpx_float8_linear_recipe {
    size_t struct_size;                /* sizeof(lpx_float8_linear_recipe) */
    lpx_float8_gemm_config fprop;      /* a = x,   b = W^T */
    lpx_float8_gemm_config dgrad;      /* a = g,   b = W   */
    lpx_float8_gemm_config wgrad;      /* a = g^T, b = x   */
    bool nonsaturating;                /* casts overflow to NaN/inf instead of clamping */
    lpx_float8_delayed_config delayed; /* history config of the states lpx_float8_linear_state_init makes */
    /* appended in ABI 1.1 (a caller's struct_size that ends before it
     * reads as 0): GEMMs (LPX_FLOAT8_FAST_ACCUM_*) whose fp8 products may
     * accumulate without promotion to f32 (lpx_fp8_scaled_mm_ex); the
     * presets set FPROP, as torchao and TransformerEngine do */
    unsigned fast_accum;
} lpx_float8_linear_recipe;

/* Bits of lpx_float8_linear_recipe.fast_accum. */
enum {
    LPX_FLOAT8_FAST_ACCUM_FPROP = 1,
    LPX_FLOAT8_FAST_ACCUM_DGRAD = 2,
    LPX_FLOAT8_FAST_ACCUM_WGRAD = 4
};

/** Fills *r with a preset: "tensorwise" (dynamic tensorwise, e4m3 x and W,
 *  e5m2 grad_output), "rowwise" (axiswise e4m3 everywhere, power-of-2
 *  scales), "rowwise_with_gw_hp" (rowwise with grad_W in high precision),
 *  "delayed" (tensorwise delayed scaling, history 1024, algo max, margin 0,
 *  e4m3 forward / e5m2 grad); every preset accumulates the forward GEMM
 *  fast (fast_accum = FPROP). NULL or "" = "tensorwise". Errors:
 *  LPX_EINVAL (NULL r), LPX_ENOTFOUND (unknown name). */
LPX_API lpx_status lpx_float8_linear_recipe_preset(const char *name, lpx_float8_linear_recipe *r);

/** Delayed-scaling states of one linear layer (caller-owned; NULL where the
 *  recipe does not use delayed scaling for that tensor). */
typedef struct lpx_float8_linear_state {
    lpx_float8_delayed *input, *weight, *grad_output;
} lpx_float8_linear_state;

/** Creates the states `r` needs (formats from the recipe, history from
 *  r->delayed); fields it does not need are set to NULL. Errors:
 *  LPX_EINVAL (NULL, inconsistent recipe), LPX_ENOMEM (nothing is left
 *  allocated). */
LPX_API lpx_status lpx_float8_linear_state_init(lpx_float8_linear_state *s, const lpx_float8_linear_recipe *r);
/** Frees the states and NULLs the fields. NULL is ignored. */
LPX_API void lpx_float8_linear_state_destroy(lpx_float8_linear_state *s);

/** What happened to one GEMM operand. */
typedef struct lpx_float8_operand_report {
    bool quantized;          /* a cast ran for this operand (stats valid) */
    bool reused;             /* a cast made earlier (forward) was used again */
    bool given_fp8;          /* the caller passed a float8 tensor, used as is */
    lpx_dtype dtype;         /* fp8 dtype used (0 in high precision) */
    lpx_float8_stats stats;  /* of the cast (when quantized or reused) */
} lpx_float8_operand_report;

typedef struct lpx_float8_gemm_report {
    int mode;                /* lpx_float8_gemm_mode that ran; -1: not run */
    lpx_float8_operand_report a, b;
} lpx_float8_gemm_report;

/** Per-GEMM report of a forward (fprop) and backward (dgrad, wgrad). */
typedef struct lpx_float8_linear_report {
    lpx_float8_gemm_report fprop, dgrad, wgrad;
} lpx_float8_linear_report;

/** What the backward of one forward call needs (opaque). */
typedef struct lpx_float8_linear_ctx lpx_float8_linear_ctx;

/** Forward of Float8Linear: out = x @ W^T (+ bias), in x's logical dtype.
 *  x [..., K] and w [N, K] are dense (f32/bf16/f16) or float8 tensors;
 *  float8 operands are used as they are (no second cast) when their
 *  scaling fits the GEMM, else dequantized and re-quantized. bias [N] may
 *  be NULL. `state` is needed when the recipe uses delayed scaling (else
 *  may be NULL) and must outlive `ctx`. If ctx is non-NULL, *ctx receives
 *  what the backward needs (references to x, w and the fp8 casts it can
 *  reuse); free it with lpx_float8_linear_ctx_free. `report` may be NULL.
 *  Errors: LPX_EINVAL (NULL, wrong role of a float8 operand, missing
 *  state), LPX_ESHAPE, LPX_EDTYPE (e5m2 x e5m2), LPX_ENUMERIC (NaN/inf
 *  with dynamic scaling), LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_linear_forward(const lpx_float8_linear_recipe *r, const lpx_float8_linear_state *state,
                                             lpx_tensor *x, lpx_tensor *w, lpx_tensor *bias, lpx_tensor **out,
                                             lpx_float8_linear_ctx **ctx, lpx_float8_linear_report *report);

/** Backward of Float8Linear for grad_out g [..., N] (dense or float8):
 *  grad_x = g @ W (x's logical dtype and shape), grad_w = g^T @ x (W's
 *  logical dtype), grad_b = sum of g over all but the last dim (g's
 *  dtype). Each output pointer may be NULL to skip that gradient. ctx is
 *  not consumed (free it with lpx_float8_linear_ctx_free). Errors: as the
 *  forward. */
LPX_API lpx_status lpx_float8_linear_backward(lpx_float8_linear_ctx *ctx, lpx_tensor *grad_out, lpx_tensor **grad_x,
                                              lpx_tensor **grad_w, lpx_tensor **grad_b,
                                              lpx_float8_linear_report *report);

/** Frees a forward context and its references. NULL is ignored. */
LPX_API void lpx_float8_linear_ctx_free(lpx_float8_linear_ctx *ctx);

/* ---- the float8_weight wrapper kind ---------------------------------- */
/* A dense master weight whose all-gather under lpx's sharding engine
 * (lpx/fsdp.h) travels as fp8. The engine sees it only through the kind
 * slots (pre/post_all_gather, master, sync_*). */

/** Options of a float8_weight (zero = tensorwise e4m3fn). */
typedef struct lpx_float8_weight_opts {
    size_t struct_size;     /* sizeof; 0 accepted */
    lpx_dtype fp8;          /* LPX_F8E4M3FN (also 0) or LPX_F8E5M2 */
    bool rowwise;           /* one scale per row, local to the owning rank:
                               no amax all-reduce at all */
    /* appended later (read only when struct_size covers it) */
    bool blockwise;         /* 128 x 128 blocks, power-of-two scales (DeepSeek-V3's weights;
                               2-D masters): sharded at whole row blocks, no amax all-reduce;
                               the gathered float8 tensor serves Float8Linear "blockwise" */
} lpx_float8_weight_opts;

/** The float8_weight kind (priority WRAPPER), or NULL before init. */
LPX_API const lpx_kind *lpx_float8_weight_kind(void);
/** True if t is a float8_weight. */
LPX_API bool lpx_float8_weight_is(const lpx_tensor *t);
/** Wraps a dense high-precision master weight (f32/bf16/f16, >= 1-D;
 *  retained, updated in place by the optimizer) into a float8_weight: its
 *  pre_all_gather casts the local shard to fp8 with the replicated scale
 *  (precomputed, or from its own amax all-reduce), post_all_gather builds
 *  a float8 tensor (role WEIGHT) for the GEMM. Errors: LPX_EINVAL,
 *  LPX_EDTYPE, LPX_ENOMEM. */
LPX_API lpx_status lpx_float8_weight_new(lpx_tensor *master, const lpx_float8_weight_opts *opts, lpx_tensor **out);
/** The master weight of a float8_weight (borrowed), or NULL. */
LPX_API lpx_tensor *lpx_float8_weight_master(const lpx_tensor *w);
/** Sets the scale the next pre_all_gather uses (> 0, finite; what
 *  lpx_fsdp_precompute_scales stores); 0 clears it. Errors: LPX_EINVAL. */
LPX_API lpx_status lpx_float8_weight_set_scale(lpx_tensor *w, float scale);
/** The fp8 format of a float8_weight (-1 if w is not one). */
LPX_API lpx_dtype lpx_float8_weight_fp8(const lpx_tensor *w);
/** True if w is a rowwise float8_weight. */
LPX_API bool lpx_float8_weight_rowwise(const lpx_tensor *w);
/** True if w is a blockwise float8_weight. */
LPX_API bool lpx_float8_weight_blockwise(const lpx_tensor *w);
/** The precomputed scale (0 when none). */
LPX_API float lpx_float8_weight_scale(const lpx_tensor *w);

LPX_END_DECLS

#endif
