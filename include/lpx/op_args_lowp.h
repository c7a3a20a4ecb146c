/* lpx — the spec families of the dense low-precision ops (fp8_*, nf4_*, qlora_dropout; ops_float8.def, ops_nf4.def, the blockwise group): the checked arguments their
 * backend kernels read (the conventions are op_args.h's; included by it,
 * not on its own).
 *
 * Each family binds the op's public meta function (meta.h: lpx_meta_fp8_*,
 * lpx_meta_nf4_*, lpx_meta_qlora_dropout) to the schema's arguments, after
 * the checks every family starts with (dense tensors of byte-sized
 * dtypes). What stays a kernel's own: checks that read data (a static
 * scale that is not finite or not > 0, an amax or a block holding NaN or
 * inf, x holding NaN for nf4_quantize: LPX_EINVAL / LPX_ENUMERIC), and
 * what a backend has no code for (the BLAS int range, a host tensor it
 * cannot read). A `Tensor(host)` argument (fp8_quantize's scale,
 * fp8_dequantize's scale_inv) may stay on the CPU whatever the other
 * tensors' device: the dispatcher's one-device rule skips it, and nothing
 * here looks at devices. */
#ifndef LPX_OP_ARGS_LOWP_H
#define LPX_OP_ARGS_LOWP_H

/** family `fp8_quantize`: fp8_quantize and fp8_quantize_t. x
 *  floating-point; fp8 f8e4m3fn or f8e5m2; scale_max >= 0; the static
 *  scale (when given) floating-point, of numel 1 (tensorwise) or the
 *  keepdim shape (lpx_meta_fp8_quantize). Results: q (fp8, x's shape),
 *  scale and scale_inv (f32, g.scale_ndim / g.scale_shape), stats (f32
 *  [4]). fp8_quantize_t also: x 2-D [R, C], no static scale when
 *  axiswise, qt a contiguous fp8 [C, R], scale_t and scale_inv_t f32 with
 *  one value (tensorwise) or contiguous [C, 1] (axiswise); g is then
 *  fp8_quantize's for dim 1 (axiswise) or none, and the messages of that
 *  part name fp8_quantize, as the reference composition's always did. */
typedef struct lpx_fp8_quantize_args {
    lpx_tensor *x;
    lpx_tensor *scale;               /* the static scale, or NULL (dynamic scaling); may be on the host */
    lpx_dtype fp8;
    bool pow2, saturate;
    double scale_max;                /* >= 0; 0: no clamp */
    lpx_fp8_quant_geom g;            /* x as [outer, D, inner], the scale's shape */
    /* fp8_quantize_t only (false / NULL for fp8_quantize) */
    bool axiswise;
    lpx_tensor *qt, *scale_t, *scale_inv_t;
} lpx_fp8_quantize_args;

/** family `fp8_dequantize`: q fp8; scale_inv floating-point, numel 1 or
 *  q's ndim with dims of 1 or q's (may be on the host); dtype a
 *  byte-sized floating-point dtype (lpx_meta_fp8_dequantize). The result:
 *  dtype, q's shape. */
typedef struct lpx_fp8_dequantize_args {
    lpx_tensor *q, *scale_inv;
    lpx_dtype dtype;
} lpx_fp8_dequantize_args;

/** family `fp8_scaled_mm`: as lpx_meta_fp8_scaled_mm says (a [M, K] and b
 *  [K, N] fp8, not both e5m2, each row- or column-major; the scales numel
 *  1 or per row of a / per column of b; bias absent or a float [N];
 *  out_dtype f32, bf16 or f16). The result: out_dtype [M, N]. */
typedef struct lpx_fp8_scaled_mm_args {
    lpx_tensor *a, *a_scale_inv, *b, *b_scale_inv;
    lpx_tensor *bias;                /* or NULL */
    lpx_dtype out_dtype;
    bool fast_accum;
    lpx_fp8_mm_geom g;
} lpx_fp8_scaled_mm_args;

/** family `fp8_scale_from_amax`: amax floating-point, fp8 a format,
 *  scale_max >= 0. The results: f32 scale and scale_inv of amax's shape. */
typedef struct lpx_fp8_scale_from_amax_args {
    lpx_tensor *amax;
    lpx_dtype fp8;
    bool pow2;
    double scale_max;
} lpx_fp8_scale_from_amax_args;

/** family `fp8_quantize_block`: x 2-D floating-point, fp8 a format, block
 *  sides in 1..65536 (lpx_meta_fp8_quantize_block). The results: q (fp8,
 *  x's shape), scale and scale_inv (f32 [g.grid_rows, g.grid_cols]),
 *  stats (f32 [4]). */
typedef struct lpx_fp8_quantize_block_args {
    lpx_tensor *x;
    lpx_dtype fp8;
    bool pow2, saturate;
    lpx_fp8_block_geom g;
} lpx_fp8_quantize_block_args;

/** family `fp8_dequantize_block`: q 2-D fp8 (any strides), scale_inv
 *  floating-point of the grid's shape, dtype a byte-sized floating-point
 *  dtype (lpx_meta_fp8_dequantize_block). The result: dtype, q's shape. */
typedef struct lpx_fp8_dequantize_block_args {
    lpx_tensor *q, *scale_inv;
    lpx_dtype dtype;
    lpx_fp8_block_geom g;
} lpx_fp8_dequantize_block_args;

/** family `fp8_mm_block`: as lpx_meta_fp8_mm_block says. The result:
 *  out_dtype [g.M, g.N]. */
typedef struct lpx_fp8_mm_block_args {
    lpx_tensor *a, *a_scale_inv, *b, *b_scale_inv;
    lpx_tensor *bias;                /* or NULL */
    lpx_dtype out_dtype;
    lpx_fp8_block_mm_geom g;
} lpx_fp8_mm_block_args;

/** An NF4 payload as the nf4 families check it (lpx_meta_nf4_payload):
 *  codes u8, qscalers i8, factors and mean f32, each contiguous 1-D and
 *  of consistent sizes; `padded` elements. Not a family of its own. */
typedef struct lpx_nf4_payload_args {
    lpx_tensor *codes, *qscalers, *factors, *mean;
    int64_t block, scaler_block;
    int64_t padded;                  /* elements the codes cover */
} lpx_nf4_payload_args;

/** family `nf4_quantize`: block and scaler_block valid, x floating-point
 *  (lpx_meta_nf4_quantize). The results: codes u8 [sz.padded / 2],
 *  qscalers i8 [sz.blocks], factors f32 [sz.scaler_blocks], mean f32 [1]. */
typedef struct lpx_nf4_quantize_args {
    lpx_tensor *x;
    int64_t block, scaler_block;
    lpx_nf4_sizes sz;
} lpx_nf4_quantize_args;

/** family `nf4_dequantize`: the payload, then elements [start, start +
 *  count) inside it, dtype f32, f16 or bf16, out (when given) a dense
 *  contiguous tensor of count elements of dtype (lpx_meta_nf4_range). The
 *  result: out, or a new dtype [count]. */
typedef struct lpx_nf4_dequantize_args {
    lpx_nf4_payload_args p;
    int64_t start, count;
    lpx_dtype dtype;
    lpx_tensor *out;                 /* or NULL */
} lpx_nf4_dequantize_args;

/** family `nf4_mm`: x dense, the payload, bias (when given) dense, then
 *  lpx_meta_nf4_mm (x floating-point [..., K], W [rows, cols] inside the
 *  payload, bias [N]). The result: x's dtype, g.out_shape. */
typedef struct lpx_nf4_mm_args {
    lpx_tensor *x;
    lpx_nf4_payload_args p;
    int64_t rows, cols;
    bool transpose_w;
    lpx_tensor *bias;                /* or NULL */
    lpx_gemm_geom g;                 /* M (x's leading dims), N, K; batch 1 */
} lpx_nf4_mm_args;

/** family `qlora_dropout`: x dense, p in [0, 1), dtype a floating-point
 *  dtype of 8+ bits (lpx_meta_qlora_dropout). The result: dtype, x's
 *  shape. */
typedef struct lpx_qlora_dropout_args {
    lpx_tensor *x;
    double p;
    uint64_t seed;
    lpx_dtype dtype;
} lpx_qlora_dropout_args;

/** This group's families, by name: X(family) each (op_args.h). */
#define LPX_SPEC_FAMILIES_LOWP(X)                                                                       \
    X(fp8_quantize) X(fp8_dequantize) X(fp8_scaled_mm) X(fp8_scale_from_amax) X(fp8_quantize_block)      \
    X(fp8_dequantize_block) X(fp8_mm_block) X(nf4_quantize) X(nf4_dequantize) X(nf4_mm) X(qlora_dropout)

#endif
