/* The op spec of the dense low-precision ops (include/lpx/op_args_lowp.h,
 * dispatch/spec_lowp.c): fp8_quantize, fp8_quantize_t, fp8_dequantize,
 * fp8_scaled_mm, fp8_scale_from_amax, the blockwise fp8 ops, nf4_quantize,
 * nf4_dequantize, nf4_mm and qlora_dropout.
 *
 * Every argument check those ops' CPU kernels made is the dispatcher's
 * now: each bad argument set below is refused alike by the CPU and by a
 * backend whose kernels check nothing (tests/spec_harness.h), with the
 * message the CPU kernels wrote themselves before the spec (pinned here).
 * Layouts the table cannot build (strided views) are checked the same way
 * by hand. Good arguments reach the check-free kernel, with the
 * normalised arguments the kernels read; a static scale or scale_inv may
 * stay on the host (Tensor(host)). Checks that read data (a static scale
 * that is not finite, NaN in a block) stay the kernels'. */
#include <math.h>
#include "spec_harness.h"

#define E4 LPX_F8E4M3FN
#define E5 LPX_F8E5M2

/* a valid NF4 payload: block 64, scaler_block 2 -> 128 elements */
#define PAYLOAD T(LPX_U8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1)

static const bad_case bad[] = {
    /* ---- fp8_quantize ---- */
    {"fp8_quantize", 7, {T(LPX_I32, 2, 2, 3), NONE, D(E4), NONE, B(0), F(0), B(1)}, LPX_EDTYPE,
     "fp8_quantize: x has dtype i32; fp8_quantize takes floating-point tensors"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), NONE, D(LPX_BF16), NONE, B(0), F(0), B(1)}, LPX_EDTYPE,
     "fp8_quantize: fp8 is bf16; it must be f8e4m3fn or f8e5m2"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), NONE, D(E4), NONE, B(0), F(-1), B(1)}, LPX_EINVAL,
     "fp8_quantize: scale_max = -1; it must be >= 0 (0: no clamp)"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), NONE, D(E4), NONE, B(0), F(NAN), B(1)}, LPX_EINVAL,
     "fp8_quantize: scale_max = nan; it must be >= 0 (0: no clamp)"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), NONE, D(E5), I(2), B(0), F(0), B(1)}, LPX_ERANGE,
     "fp8_quantize: dim 2 out of range for 2 dims"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), NONE, D(E5), I(-3), B(0), F(0), B(1)}, LPX_ERANGE,
     "fp8_quantize: dim -3 out of range for 2 dims"},
    {"fp8_quantize", 7, {T(LPX_F32, 0, 0), NONE, D(E4), I(0), B(0), F(0), B(1)}, LPX_ESHAPE,
     "fp8_quantize: dim 0 given for a 0-d x; axiswise scaling needs at least 1 dim"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), T(LPX_I32, 0, 0), D(E4), NONE, B(0), F(0), B(1)}, LPX_EDTYPE,
     "fp8_quantize: scale has dtype i32; fp8_quantize takes floating-point tensors"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 2), D(E4), NONE, B(0), F(0), B(1)}, LPX_ESHAPE,
     "fp8_quantize: static scale has shape [2]; this quantization needs 1 scale value"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 1, 3), D(E4), I(1), B(0), F(0), B(1)}, LPX_ESHAPE,
     "fp8_quantize: static scale has shape [1, 3]; this quantization needs 2 scale values in the keepdim shape "
     "(x's shape with the reduced dim = 1)"},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 2), D(E4), I(-1), B(0), F(0), B(1)}, LPX_ESHAPE,
     "fp8_quantize: static scale has shape [2]; this quantization needs 2 scale values in the keepdim shape "
     "(x's shape with the reduced dim = 1)"},

    /* ---- fp8_quantize_t: its own checks, then fp8_quantize's (named so) ---- */
    {"fp8_quantize_t", 10, {T(LPX_F32, 3, 2, 3, 4), NONE, D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_ESHAPE,
     "fp8_quantize_t: x has shape [2, 3, 4]; the transposed quantize takes a 2-D x [R, C]"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 0, 0), D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 2, 3, 1), T(LPX_F32, 2, 3, 1)}, LPX_EINVAL,
     "fp8_quantize_t: a static scale was given with axiswise scaling; static scales are tensorwise here (x and x^T "
     "would need different ones)"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(LPX_F16), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_EDTYPE,
     "fp8_quantize_t: fp8 is f16; it must be f8e4m3fn or f8e5m2"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 2, 3),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_ESHAPE,
     "fp8_quantize_t: qt is f8e4m3fn [2, 3]; expected a contiguous f8e4m3fn [3, 2]"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(0), B(1), T(E5, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_ESHAPE,
     "fp8_quantize_t: qt is f8e5m2 [3, 2]; expected a contiguous f8e4m3fn [3, 2]"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 1, 2), T(LPX_F32, 0, 0)}, LPX_ESHAPE,
     "fp8_quantize_t: scale_t and scale_inv_t must be f32 with 1 value (numel 1, tensorwise)"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_BF16, 0, 0)}, LPX_ESHAPE,
     "fp8_quantize_t: scale_t and scale_inv_t must be f32 with 1 value (numel 1, tensorwise)"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 1, 3), T(LPX_F32, 2, 3, 1)}, LPX_ESHAPE,
     "fp8_quantize_t: scale_t is f32 [3]; expected a contiguous f32 [3, 1]"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 2, 3, 1), T(LPX_F32, 2, 1, 3)}, LPX_ESHAPE,
     "fp8_quantize_t: scale_inv_t is f32 [1, 3]; expected a contiguous f32 [3, 1]"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 1, 2), T(LPX_F32, 2, 3, 1)}, LPX_ESHAPE,
     "fp8_quantize_t: scale_t and scale_inv_t must be f32 with 3 values ([C, 1])"},
    {"fp8_quantize_t", 10, {T(LPX_I32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_EDTYPE,
     "fp8_quantize_t: x has dtype i32; fp8_quantize_t takes floating-point tensors"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(-2), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_EINVAL,
     "fp8_quantize_t: scale_max = -2; it must be >= 0 (0: no clamp)"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), T(LPX_U8, 0, 0), D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_EDTYPE,
     "fp8_quantize_t: scale has dtype u8; fp8_quantize_t takes floating-point tensors"},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 1, 2), D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_ESHAPE,
     "fp8_quantize_t: static scale has shape [2]; this quantization needs 1 scale value"},

    /* ---- fp8_dequantize ---- */
    {"fp8_dequantize", 3, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 0, 0), D(LPX_F32)}, LPX_EDTYPE,
     "fp8_dequantize: q is f32; it must be f8e4m3fn or f8e5m2"},
    {"fp8_dequantize", 3, {T(E4, 2, 2, 3), T(LPX_I32, 0, 0), D(LPX_F32)}, LPX_EDTYPE,
     "fp8_dequantize: scale_inv has dtype i32; fp8_dequantize takes floating-point tensors"},
    {"fp8_dequantize", 3, {T(E5, 2, 2, 3), T(LPX_F32, 0, 0), D(LPX_I64)}, LPX_EDTYPE,
     "fp8_dequantize: dtype i64 is not a byte-sized floating-point dtype"},
    {"fp8_dequantize", 3, {T(E4, 2, 2, 3), T(LPX_F32, 2, 3, 1), D(LPX_F32)}, LPX_ESHAPE,
     "fp8_dequantize: scale_inv of shape [3, 1] does not fit q of shape [2, 3] (numel 1, or q's ndim with dims of 1 "
     "or q's size)"},
    {"fp8_dequantize", 3, {T(E4, 2, 2, 3), T(LPX_F32, 1, 3), D(LPX_BF16)}, LPX_ESHAPE,
     "fp8_dequantize: scale_inv of shape [3] does not fit q of shape [2, 3] (numel 1, or q's ndim with dims of 1 or "
     "q's size)"},

    /* ---- fp8_scaled_mm ---- */
    {"fp8_scaled_mm", 7, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: a is f32; it must be f8e4m3fn or f8e5m2"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(LPX_U8, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: b is u8; it must be f8e4m3fn or f8e5m2"},
    {"fp8_scaled_mm", 7, {T(E5, 2, 2, 3), T(LPX_F32, 0, 0), T(E5, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: a and b are both f8e5m2; e5m2 x e5m2 GEMMs are refused (cuBLASLt has no such kernel): "
     "quantize one operand as f8e4m3fn"},
    {"fp8_scaled_mm", 7, {T(E4, 3, 1, 2, 3), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_ESHAPE,
     "fp8_scaled_mm: a [1, 2, 3] and b [3, 4] must be 2-D matrices [M, K] and [K, N]"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(E5, 2, 4, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_ESHAPE,
     "fp8_scaled_mm: a [2, 3] and b [4, 4]: K mismatch (3 vs 4)"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(E4), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: out_dtype f8e4m3fn; the scaled GEMM writes f32, bf16 or f16"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), T(LPX_I32, 1, 4),
                          D(LPX_F32), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: bias has dtype i32; fp8_scaled_mm takes floating-point tensors"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), T(LPX_F32, 2, 1, 4),
                          D(LPX_BF16), B(1)}, LPX_ESHAPE,
     "fp8_scaled_mm: bias [1, 4] must be [N] = [4]"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_I32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: a_scale_inv has dtype i32; fp8_scaled_mm takes floating-point tensors"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 2, 1, 2), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), NONE,
                          D(LPX_F32), B(0)}, LPX_ESHAPE,
     "fp8_scaled_mm: a_scale_inv has shape [1, 2]; expected numel 1 (tensorwise) or [2, 1]"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 2, 2, 1), T(E4, 2, 3, 4), T(LPX_F16, 2, 4, 1), NONE,
                          D(LPX_F16), B(0)}, LPX_ESHAPE,
     "fp8_scaled_mm: b_scale_inv has shape [4, 1]; expected numel 1 (tensorwise) or [1, 4]"},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_I8, 2, 1, 4), NONE,
                          D(LPX_F32), B(0)}, LPX_EDTYPE,
     "fp8_scaled_mm: b_scale_inv has dtype i8; fp8_scaled_mm takes floating-point tensors"},

    /* ---- fp8_scale_from_amax ---- */
    {"fp8_scale_from_amax", 4, {T(LPX_I32, 1, 3), D(E4), B(0), F(0)}, LPX_EDTYPE,
     "fp8_scale_from_amax: amax has dtype i32; fp8_scale_from_amax takes floating-point tensors"},
    {"fp8_scale_from_amax", 4, {T(LPX_F32, 1, 3), D(LPX_F32), B(0), F(0)}, LPX_EDTYPE,
     "fp8_scale_from_amax: fp8 is f32; it must be f8e4m3fn or f8e5m2"},
    {"fp8_scale_from_amax", 4, {T(LPX_F32, 1, 3), D(E5), B(1), F(-0.5)}, LPX_EINVAL,
     "fp8_scale_from_amax: scale_max = -0.5; it must be >= 0 (0: no clamp)"},

    /* ---- fp8_quantize_block ---- */
    {"fp8_quantize_block", 6, {T(LPX_F32, 1, 8), D(E4), I(1), I(4), B(0), B(1)}, LPX_ESHAPE,
     "fp8_quantize_block: x has shape [8]; blockwise fp8 takes 2-D tensors [rows, cols]"},
    {"fp8_quantize_block", 6, {T(LPX_I64, 2, 2, 8), D(E4), I(1), I(4), B(0), B(1)}, LPX_EDTYPE,
     "fp8_quantize_block: x is i64; it must be a byte-sized floating-point dtype"},
    {"fp8_quantize_block", 6, {T(LPX_BF16, 2, 2, 8), D(LPX_BF16), I(1), I(4), B(0), B(1)}, LPX_EDTYPE,
     "fp8_quantize_block: fp8 is bf16; it must be f8e4m3fn or f8e5m2"},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 2, 8), D(E5), I(0), I(4), B(0), B(1)}, LPX_EINVAL,
     "fp8_quantize_block: blocks of 0 x 4; each side must be in 1..65536"},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 2, 8), D(E5), I(1), I(65537), B(1), B(0)}, LPX_EINVAL,
     "fp8_quantize_block: blocks of 1 x 65537; each side must be in 1..65536"},

    /* ---- fp8_dequantize_block ---- */
    {"fp8_dequantize_block", 5, {T(E4, 3, 1, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), D(LPX_F32)}, LPX_ESHAPE,
     "fp8_dequantize_block: q has shape [1, 2, 8]; blockwise fp8 takes 2-D tensors [rows, cols]"},
    {"fp8_dequantize_block", 5, {T(LPX_F16, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), D(LPX_F32)}, LPX_EDTYPE,
     "fp8_dequantize_block: q is f16; it must be f8e4m3fn or f8e5m2"},
    {"fp8_dequantize_block", 5, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), D(LPX_BOOL)}, LPX_EDTYPE,
     "fp8_dequantize_block: dtype is bool; it must be a byte-sized floating-point dtype"},
    {"fp8_dequantize_block", 5, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(-4), D(LPX_F32)}, LPX_EINVAL,
     "fp8_dequantize_block: blocks of 1 x -4; each side must be in 1..65536"},
    {"fp8_dequantize_block", 5, {T(E5, 2, 2, 8), T(LPX_I32, 2, 2, 2), I(1), I(4), D(LPX_F32)}, LPX_EDTYPE,
     "fp8_dequantize_block: scale_inv is i32; it must be a byte-sized floating-point dtype"},
    {"fp8_dequantize_block", 5, {T(E5, 2, 2, 8), T(LPX_F32, 2, 2, 3), I(1), I(4), D(LPX_BF16)}, LPX_ESHAPE,
     "fp8_dequantize_block: scale_inv has shape [2, 3]; blocks of 1 x 4 over [2, 8] need [2, 2]"},
    {"fp8_dequantize_block", 5, {T(E5, 2, 5, 8), T(LPX_F32, 1, 2), I(4), I(8), D(LPX_F32)}, LPX_ESHAPE,
     "fp8_dequantize_block: scale_inv has shape [2]; blocks of 4 x 8 over [5, 8] need [2, 1]"},

    /* ---- fp8_mm_block ---- */
    {"fp8_mm_block", 10, {T(E4, 1, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3), I(4),
                          I(1), NONE, D(LPX_F32)}, LPX_ESHAPE,
     "fp8_mm_block: a has shape [8]; blockwise fp8 takes 2-D tensors [rows, cols]"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 3, 1, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_F32)}, LPX_ESHAPE,
     "fp8_mm_block: b has shape [1, 8, 3]; blockwise fp8 takes 2-D tensors [rows, cols]"},
    {"fp8_mm_block", 10, {T(LPX_BF16, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3),
                          T(LPX_F32, 2, 2, 3), I(4), I(1), NONE, D(LPX_F32)}, LPX_EDTYPE,
     "fp8_mm_block: a is bf16; it must be f8e4m3fn or f8e5m2"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(LPX_F32, 2, 8, 3),
                          T(LPX_F32, 2, 2, 3), I(4), I(1), NONE, D(LPX_F32)}, LPX_EDTYPE,
     "fp8_mm_block: b is f32; it must be f8e4m3fn or f8e5m2"},
    {"fp8_mm_block", 10, {T(E5, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E5, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_F32)}, LPX_EDTYPE,
     "fp8_mm_block: a and b are both f8e5m2; e5m2 x e5m2 GEMMs are refused (as cuBLASLt does)"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E5, 2, 7, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_F32)}, LPX_ESHAPE,
     "fp8_mm_block: a [2, 8] @ b [7, 3]: inner dims differ"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 1, 3),
                          I(8), I(1), NONE, D(LPX_F32)}, LPX_EINVAL,
     "fp8_mm_block: a's blocks span 4 columns of K but b's span 8 rows; the K blocks must be the same (kb x kb "
     "promotion)"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(0), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_F32)}, LPX_EINVAL,
     "fp8_mm_block: blocks of 0 x 4; each side must be in 1..65536"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(70000), NONE, D(LPX_F32)}, LPX_EINVAL,
     "fp8_mm_block: blocks of 4 x 70000; each side must be in 1..65536"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 1, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_F32)}, LPX_ESHAPE,
     "fp8_mm_block: a_scale_inv has shape [1, 2]; blocks of 1 x 4 over [2, 8] need [2, 2]"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_I32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_F32)}, LPX_EDTYPE,
     "fp8_mm_block: a_scale_inv is i32; it must be a byte-sized floating-point dtype"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 2),
                          I(4), I(128), NONE, D(LPX_F32)}, LPX_ESHAPE,
     "fp8_mm_block: b_scale_inv has shape [2, 2]; blocks of 4 x 128 over [8, 3] need [2, 1]"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), NONE, D(LPX_I32)}, LPX_EDTYPE,
     "fp8_mm_block: out_dtype i32; it must be f32, bf16 or f16"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), T(LPX_I32, 1, 3), D(LPX_F32)}, LPX_EDTYPE,
     "fp8_mm_block: bias is i32; it must be a byte-sized floating-point dtype"},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E4, 2, 8, 3), T(LPX_F32, 2, 2, 3),
                          I(4), I(1), T(LPX_F32, 2, 1, 3), D(LPX_BF16)}, LPX_ESHAPE,
     "fp8_mm_block: bias has shape [1, 3]; expected [3]"},

    /* ---- nf4_quantize ---- */
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(63), I(2)}, LPX_EINVAL,
     "nf4_quantize: block = 63 must be even and in 32..4096"},
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(16), I(2)}, LPX_EINVAL,
     "nf4_quantize: block = 16 must be even and in 32..4096"},
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(64), I(0)}, LPX_EINVAL,
     "nf4_quantize: scaler_block = 0 must be in 1..65536"},
    {"nf4_quantize", 3, {T(LPX_I32, 1, 100), I(64), I(2)}, LPX_EDTYPE,
     "nf4_quantize: x has dtype i32; NF4 quantizes floating-point tensors"},

    /* ---- nf4_dequantize ---- */
    {"nf4_dequantize", 10, {PAYLOAD, I(30), I(2), I(0), I(128), D(LPX_F32), NONE}, LPX_EINVAL,
     "nf4_dequantize: block = 30 must be even and in 32..4096"},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(70000), I(0), I(128), D(LPX_F32), NONE}, LPX_EINVAL,
     "nf4_dequantize: scaler_block = 70000 must be in 1..65536"},
    {"nf4_dequantize", 10, {T(LPX_I8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_EDTYPE,
     "nf4_dequantize: codes has dtype i8, expected u8"},
    {"nf4_dequantize", 10, {T(LPX_U8, 2, 8, 8), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_ESHAPE,
     "nf4_dequantize: codes [8, 8] must be a contiguous 1-D tensor"},
    {"nf4_dequantize", 10, {T(LPX_U8, 1, 64), T(LPX_U8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_EDTYPE,
     "nf4_dequantize: qscalers has dtype u8, expected i8"},
    {"nf4_dequantize", 10, {T(LPX_U8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F16, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_EDTYPE,
     "nf4_dequantize: factors has dtype f16, expected f32"},
    {"nf4_dequantize", 10, {T(LPX_U8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 0, 0), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_ESHAPE,
     "nf4_dequantize: mean [] must be a contiguous 1-D tensor"},
    {"nf4_dequantize", 10, {T(LPX_U8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 2), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_ESHAPE,
     "nf4_dequantize: mean has 2 elements, expected 1"},
    {"nf4_dequantize", 10, {T(LPX_U8, 1, 32), T(LPX_I8, 1, 1), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                            I(0), I(64), D(LPX_F32), NONE}, LPX_ESHAPE,
     "nf4_dequantize: codes cover 64 elements, not a whole number of scaler blocks of 64 x 2"},
    {"nf4_dequantize", 10, {T(LPX_U8, 1, 64), T(LPX_I8, 1, 3), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                            I(0), I(128), D(LPX_F32), NONE}, LPX_ESHAPE,
     "nf4_dequantize: 128 codes need 2 qscalers and 1 factors, got 3 and 1"},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(0), I(128), D(LPX_I32), NONE}, LPX_EDTYPE,
     "nf4_dequantize: dtype i32: NF4 dequantizes to f32, f16 or bf16"},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(-1), I(10), D(LPX_F32), NONE}, LPX_ERANGE,
     "nf4_dequantize: elements [-1, -1 + 10) outside the 128 the payload holds"},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(100), I(29), D(LPX_BF16), NONE}, LPX_ERANGE,
     "nf4_dequantize: elements [100, 100 + 29) outside the 128 the payload holds"},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(0), I(128), D(LPX_F32), T(LPX_F16, 1, 128)}, LPX_ESHAPE,
     "nf4_dequantize: out must be a contiguous f32 tensor of 128 elements (is f16, 128, contiguous)"},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(0), I(64), D(LPX_F16), T(LPX_F16, 2, 8, 9)}, LPX_ESHAPE,
     "nf4_dequantize: out must be a contiguous f16 tensor of 64 elements (is f16, 72, contiguous)"},

    /* ---- nf4_mm ---- */
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), T(LPX_U8, 1, 64), T(LPX_I8, 1, 2), T(LPX_F32, 1, 2), T(LPX_F32, 1, 1),
                    I(64), I(2), I(8), I(16), B(1), NONE}, LPX_ESHAPE,
     "nf4_mm: 128 codes need 2 qscalers and 1 factors, got 2 and 2"},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), PAYLOAD, I(64), I(0), I(8), I(16), B(1), NONE}, LPX_EINVAL,
     "nf4_mm: scaler_block = 0 must be in 1..65536"},
    {"nf4_mm", 11, {T(LPX_I32, 2, 3, 16), PAYLOAD, I(64), I(2), I(8), I(16), B(1), NONE}, LPX_EDTYPE,
     "nf4_mm: x has dtype i32, expected a floating-point dtype"},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), PAYLOAD, I(64), I(2), I(9), I(16), B(1), NONE}, LPX_ESHAPE,
     "nf4_mm: W [9, 16] needs more elements than the 128 the payload holds"},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), PAYLOAD, I(64), I(2), I(-1), I(16), B(1), NONE}, LPX_ESHAPE,
     "nf4_mm: W [-1, 16] needs more elements than the 128 the payload holds"},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), PAYLOAD, I(64), I(2), I(8), I(16), B(0), NONE}, LPX_ESHAPE,
     "nf4_mm: x [3, 16] must end in 8 (W is [8, 16])"},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 8), PAYLOAD, I(64), I(2), I(8), I(16), B(1), NONE}, LPX_ESHAPE,
     "nf4_mm: x [3, 8] must end in 16 (W is [8, 16], used transposed)"},
    {"nf4_mm", 11, {T(LPX_F32, 0, 0), PAYLOAD, I(64), I(2), I(8), I(16), B(1), NONE}, LPX_ESHAPE,
     "nf4_mm: x [] must end in 16 (W is [8, 16], used transposed)"},
    {"nf4_mm", 11, {T(LPX_BF16, 2, 3, 16), PAYLOAD, I(64), I(2), I(8), I(16), B(1), T(LPX_F32, 1, 16)}, LPX_ESHAPE,
     "nf4_mm: bias [16] must be [8]"},
    {"nf4_mm", 11, {T(LPX_BF16, 2, 3, 8), PAYLOAD, I(64), I(2), I(8), I(16), B(0), T(LPX_F32, 2, 1, 16)}, LPX_ESHAPE,
     "nf4_mm: bias [1, 16] must be [16]"},

    /* ---- qlora_dropout ---- */
    {"qlora_dropout", 4, {T(LPX_F32, 2, 2, 3), F(1.0), I(7), D(LPX_F32)}, LPX_EINVAL,
     "qlora_dropout: p = 1 must be in [0, 1)"},
    {"qlora_dropout", 4, {T(LPX_F32, 2, 2, 3), F(-0.25), I(7), D(LPX_F32)}, LPX_EINVAL,
     "qlora_dropout: p = -0.25 must be in [0, 1)"},
    {"qlora_dropout", 4, {T(LPX_F32, 2, 2, 3), F(NAN), I(7), D(LPX_F32)}, LPX_EINVAL,
     "qlora_dropout: p = nan must be in [0, 1)"},
    {"qlora_dropout", 4, {T(LPX_F32, 2, 2, 3), F(0.5), I(7), D(LPX_I32)}, LPX_EDTYPE,
     "qlora_dropout: dtype i32 is not a floating-point dtype the kernels store"},
};

/* ---- layouts the table cannot build: one argument a strided view ---- */

typedef struct view_case {
    bad_case k;            /* the arguments; the one at vi is the view's base */
    int vi;
    int ndim;
    int64_t shape[2], strides[2];
} view_case;

static const view_case bad_views[] = {
    {{"fp8_scaled_mm", 7, {T(E4, 2, 2, 8), T(LPX_F32, 0, 0), T(E4, 2, 3, 4), T(LPX_F32, 0, 0), NONE, D(LPX_F32),
                           B(0)}, LPX_ESHAPE,
      "fp8_scaled_mm: a of shape [2, 3] has strides (8, 2); the GEMM takes row-major (stride[1] == 1) or "
      "column-major (stride[0] == 1) operands: make it contiguous first"},
     0, 2, {2, 3}, {8, 2}},
    {{"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 0, 0), T(E5, 2, 6, 8), T(LPX_F32, 0, 0), NONE, D(LPX_F32),
                           B(0)}, LPX_ESHAPE,
      "fp8_scaled_mm: b of shape [3, 4] has strides (16, 2); the GEMM takes row-major (stride[1] == 1) or "
      "column-major (stride[0] == 1) operands: make it contiguous first"},
     2, 2, {3, 4}, {16, 2}},
    {{"nf4_dequantize", 10, {T(LPX_U8, 1, 128), T(LPX_I8, 1, 2), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1), I(64), I(2),
                             I(0), I(128), D(LPX_F32), NONE}, LPX_ESHAPE,
      "nf4_dequantize: codes [64] must be a contiguous 1-D tensor"},
     0, 1, {64}, {2}},
    {{"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(0), I(128), D(LPX_F32), T(LPX_F32, 1, 256)}, LPX_ESHAPE,
      "nf4_dequantize: out must be a contiguous f32 tensor of 128 elements (is f32, 128, strided)"},
     9, 1, {128}, {2}},
    {{"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), T(LPX_U8, 1, 64), T(LPX_I8, 1, 4), T(LPX_F32, 1, 1), T(LPX_F32, 1, 1),
                     I(64), I(2), I(8), I(16), B(1), NONE}, LPX_ESHAPE,
      "nf4_mm: qscalers [2] must be a contiguous 1-D tensor"},
     2, 1, {2}, {2}},
    {{"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(0), B(0), F(0), B(1), T(E4, 2, 2, 3),
                             T(LPX_F32, 0, 0), T(LPX_F32, 0, 0)}, LPX_ESHAPE,
      "fp8_quantize_t: qt is f8e4m3fn [3, 2] (not contiguous); expected a contiguous f8e4m3fn [3, 2]"},
     7, 2, {3, 2}, {1, 3}},
    {{"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                             T(LPX_F32, 1, 6), T(LPX_F32, 2, 3, 1)}, LPX_ESHAPE,
      "fp8_quantize_t: scale_t is f32 [3, 1] (not contiguous); expected a contiguous f32 [3, 1]"},
     8, 2, {3, 1}, {2, 1}},
};

static lpx_status run_view_case(const view_case *v, lpx_device dev, char *msg, size_t len)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(v->k.op, &op));
    built_args b;
    spec_build(&v->k, dev, &b);
    lpx_tensor *view = NULL;
    CHECK_OK(lpx_tensor_view_of(b.ts[v->vi], v->ndim, v->shape, v->strides, 0, &view));
    b.v[v->vi] = lpx_v_tensor(view);
    lpx_call c;
    lpx_call_init(&c, op, b.v, v->k.nargs);
    lpx_status st = lpx_dispatch(&c);
    snprintf(msg, len, "%s", st ? lpx_last_error() : "");
    if (!st) lpx_call_release_rets(&c);
    lpx_tensor_release(view);
    spec_built_free(&b);
    return st;
}

static void test_refused_by_dispatcher(void) { spec_check_bad(bad, sizeof bad / sizeof *bad); }

/* The views: refused alike by the CPU and the check-free backend, with the
 * CPU kernels' message from before the spec. */
static void test_views_refused(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    for (size_t i = 0; i < sizeof bad_views / sizeof *bad_views; i++) {
        const bad_case *k = &bad_views[i].k;
        char cpu_msg[1024], nc_msg[1024];
        lpx_status cpu_st = run_view_case(&bad_views[i], lpx_cpu(), cpu_msg, sizeof cpu_msg);
        int before = reached;
        lpx_status nc_st = run_view_case(&bad_views[i], nc, nc_msg, sizeof nc_msg);
        CHECKF(cpu_st == k->want, "view %zu (%s): cpu status %d, want %d (%s)", i, k->op, cpu_st, k->want, cpu_msg);
        CHECKF(nc_st == cpu_st && reached == before, "view %zu (%s): check-free backend %d, kernel %s (%s)", i,
               k->op, nc_st, reached == before ? "not run" : "ran", nc_msg);
        CHECKF(!strcmp(cpu_msg, nc_msg), "view %zu (%s): messages differ:\n  cpu:    %s\n  nochk:  %s", i, k->op,
               cpu_msg, nc_msg);
        CHECKF(!strcmp(cpu_msg, k->msg), "view %zu (%s): message '%s', want '%s'", i, k->op, cpu_msg, k->msg);
    }
}

/* Good arguments reach the check-free kernel. */
static const bad_case good[] = {
    {"fp8_quantize", 7, {T(LPX_BF16, 2, 2, 3), NONE, D(E4), NONE, B(1), F(448), B(1)}, LPX_OK, NULL},
    {"fp8_quantize", 7, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 2, 2, 1), D(E5), I(-1), B(0), F(0), B(0)}, LPX_OK, NULL},
    {"fp8_quantize", 7, {T(LPX_F16, 0, 0), T(LPX_F32, 1, 1), D(E4), NONE, B(0), F(0), B(1)}, LPX_OK, NULL},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), NONE, D(E4), B(1), B(0), F(0), B(1), T(E4, 2, 3, 2),
                            T(LPX_F32, 2, 3, 1), T(LPX_F32, 2, 3, 1)}, LPX_OK, NULL},
    {"fp8_quantize_t", 10, {T(LPX_F32, 2, 2, 3), T(LPX_F32, 0, 0), D(E5), B(0), B(0), F(0), B(1), T(E5, 2, 3, 2),
                            T(LPX_F32, 1, 1), T(LPX_F32, 0, 0)}, LPX_OK, NULL},
    {"fp8_dequantize", 3, {T(E4, 2, 2, 3), T(LPX_F32, 2, 2, 1), D(LPX_BF16)}, LPX_OK, NULL},
    {"fp8_scaled_mm", 7, {T(E4, 2, 2, 3), T(LPX_F32, 2, 2, 1), T(E5, 2, 3, 4), T(LPX_F32, 2, 1, 4),
                          T(LPX_F32, 1, 4), D(LPX_BF16), B(1)}, LPX_OK, NULL},
    {"fp8_scale_from_amax", 4, {T(LPX_F32, 1, 3), D(E4), B(1), F(0)}, LPX_OK, NULL},
    {"fp8_quantize_block", 6, {T(LPX_F32, 2, 5, 8), D(E4), I(4), I(4), B(0), B(1)}, LPX_OK, NULL},
    {"fp8_dequantize_block", 5, {T(E4, 2, 5, 8), T(LPX_F32, 2, 2, 2), I(4), I(4), D(LPX_F16)}, LPX_OK, NULL},
    {"fp8_mm_block", 10, {T(E4, 2, 2, 8), T(LPX_F32, 2, 2, 2), I(1), I(4), T(E5, 2, 8, 3), T(LPX_F32, 2, 2, 1),
                          I(4), I(128), T(LPX_F32, 1, 3), D(LPX_F32)}, LPX_OK, NULL},
    {"nf4_quantize", 3, {T(LPX_F32, 1, 100), I(64), I(2)}, LPX_OK, NULL},
    {"nf4_dequantize", 10, {PAYLOAD, I(64), I(2), I(10), I(100), D(LPX_F16), T(LPX_F16, 2, 10, 10)}, LPX_OK, NULL},
    {"nf4_mm", 11, {T(LPX_F32, 2, 3, 16), PAYLOAD, I(64), I(2), I(8), I(16), B(1), T(LPX_F32, 1, 8)}, LPX_OK, NULL},
    {"qlora_dropout", 4, {T(LPX_BF16, 2, 2, 3), F(0.1), I(7), D(LPX_F32)}, LPX_OK, NULL},
};

static void test_good_args_reach_kernel(void) { spec_check_good(good, sizeof good / sizeof *good); }

static lpx_op find(const char *name)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(name, &op));
    return op;
}

static lpx_tensor *nt(lpx_device d, lpx_dtype dt, int ndim, const int64_t *shape)
{
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_tensor_new(dt, ndim, shape, d, &t));
    return t;
}

/* The normalised arguments the kernels read (lpx_op_spec_run). */
static void test_normalised_args(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_op_frame f;

    /* fp8_quantize, rowwise over dim -1 with a static keepdim scale */
    lpx_tensor *x = nt(nc, LPX_BF16, 3, (const int64_t[]){2, 3, 5}), *s = nt(nc, LPX_F32, 3, (const int64_t[]){2, 3, 1});
    lpx_value qv[7] = {lpx_v_tensor(x), lpx_v_tensor(s), lpx_v_dtype(E5), lpx_v_i64(-1), lpx_v_bool(true),
                       lpx_v_f64(65504), lpx_v_bool(false)};
    lpx_call_init(&f.call, find("fp8_quantize"), qv, 7);
    f.call.key = nc_key;
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_fp8_quantize_args *qa = &f.args.fp8_quantize;
    CHECK(qa->x == x && qa->scale == s && qa->fp8 == E5 && qa->pow2 && !qa->saturate && qa->scale_max == 65504);
    CHECK(qa->g.outer == 6 && qa->g.D == 5 && qa->g.inner == 1 && qa->g.groups == 6 && !qa->g.tensorwise);
    CHECK(qa->g.scale_ndim == 3 && qa->g.scale_shape[2] == 1 && qa->g.scale_shape[1] == 3);
    CHECK(!qa->axiswise && !qa->qt && !qa->scale_t && !qa->scale_inv_t);
    /* columns: dim 0 */
    qv[1] = lpx_v_none();
    qv[3] = lpx_v_i64(0);
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    CHECK(!qa->scale && qa->g.outer == 1 && qa->g.D == 2 && qa->g.inner == 15 && qa->g.scale_shape[0] == 1);

    /* fp8_quantize_t axiswise: fp8_quantize's geometry for dim 1 */
    lpx_tensor *x2 = nt(nc, LPX_F32, 2, (const int64_t[]){4, 6}), *qt = nt(nc, E4, 2, (const int64_t[]){6, 4});
    lpx_tensor *st = nt(nc, LPX_F32, 2, (const int64_t[]){6, 1}), *sit = nt(nc, LPX_F32, 2, (const int64_t[]){6, 1});
    lpx_value tv[10] = {lpx_v_tensor(x2), lpx_v_none(), lpx_v_dtype(E4), lpx_v_bool(true), lpx_v_bool(false),
                        lpx_v_f64(0), lpx_v_bool(true), lpx_v_tensor(qt), lpx_v_tensor(st), lpx_v_tensor(sit)};
    lpx_call_init(&f.call, find("fp8_quantize_t"), tv, 10);
    f.call.key = nc_key;
    CHECK(lpx_op_spec_size(f.call.op) == sizeof(lpx_fp8_quantize_args));
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    CHECK(qa->x == x2 && qa->axiswise && qa->qt == qt && qa->scale_t == st && qa->scale_inv_t == sit);
    CHECK(qa->saturate && qa->g.outer == 4 && qa->g.D == 6 && qa->g.scale_ndim == 2 && qa->g.scale_shape[0] == 4);

    /* fp8_scaled_mm: rowwise a, tensorwise b */
    lpx_tensor *a = nt(nc, E4, 2, (const int64_t[]){3, 5}), *as = nt(nc, LPX_F32, 2, (const int64_t[]){3, 1});
    lpx_tensor *b = nt(nc, E5, 2, (const int64_t[]){5, 7}), *bs = nt(nc, LPX_F32, 0, NULL);
    lpx_value mv[7] = {lpx_v_tensor(a), lpx_v_tensor(as), lpx_v_tensor(b), lpx_v_tensor(bs), lpx_v_none(),
                       lpx_v_dtype(LPX_F16), lpx_v_bool(true)};
    lpx_call_init(&f.call, find("fp8_scaled_mm"), mv, 7);
    f.call.key = nc_key;
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_fp8_scaled_mm_args *ma = &f.args.fp8_scaled_mm;
    CHECK(ma->a == a && ma->b == b && ma->a_scale_inv == as && ma->b_scale_inv == bs && !ma->bias);
    CHECK(ma->out_dtype == LPX_F16 && ma->fast_accum && ma->g.M == 3 && ma->g.K == 5 && ma->g.N == 7);
    CHECK(ma->g.a_rowwise && !ma->g.b_colwise);

    /* fp8_mm_block: the two grids */
    lpx_tensor *ba = nt(nc, E4, 2, (const int64_t[]){3, 10}), *bas = nt(nc, LPX_F32, 2, (const int64_t[]){3, 3});
    lpx_tensor *bb = nt(nc, E4, 2, (const int64_t[]){10, 2}), *bbs = nt(nc, LPX_F32, 2, (const int64_t[]){3, 1});
    lpx_value bv[10] = {lpx_v_tensor(ba), lpx_v_tensor(bas), lpx_v_i64(1), lpx_v_i64(4), lpx_v_tensor(bb),
                        lpx_v_tensor(bbs), lpx_v_i64(4), lpx_v_i64(128), lpx_v_none(), lpx_v_dtype(LPX_BF16)};
    lpx_call_init(&f.call, find("fp8_mm_block"), bv, 10);
    f.call.key = nc_key;
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_fp8_mm_block_args *mb = &f.args.fp8_mm_block;
    CHECK(mb->g.M == 3 && mb->g.K == 10 && mb->g.N == 2 && mb->out_dtype == LPX_BF16 && !mb->bias);
    CHECK(mb->g.a.grid_rows == 3 && mb->g.a.grid_cols == 3 && mb->g.b.grid_rows == 3 && mb->g.b.grid_cols == 1);

    /* nf4_mm: the payload and the GEMM's geometry */
    lpx_tensor *nx = nt(nc, LPX_F16, 3, (const int64_t[]){2, 3, 8}), *codes = nt(nc, LPX_U8, 1, (const int64_t[]){64});
    lpx_tensor *qs = nt(nc, LPX_I8, 1, (const int64_t[]){2}), *fa = nt(nc, LPX_F32, 1, (const int64_t[]){1});
    lpx_tensor *mean = nt(nc, LPX_F32, 1, (const int64_t[]){1});
    lpx_value nv[11] = {lpx_v_tensor(nx), lpx_v_tensor(codes), lpx_v_tensor(qs), lpx_v_tensor(fa), lpx_v_tensor(mean),
                        lpx_v_i64(64), lpx_v_i64(2), lpx_v_i64(8), lpx_v_i64(16), lpx_v_bool(false), lpx_v_none()};
    lpx_call_init(&f.call, find("nf4_mm"), nv, 11);
    f.call.key = nc_key;
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_nf4_mm_args *na = &f.args.nf4_mm;
    CHECK(na->x == nx && na->p.codes == codes && na->p.mean == mean && na->p.padded == 128 && na->p.block == 64);
    CHECK(na->rows == 8 && na->cols == 16 && !na->transpose_w && !na->bias);
    CHECK(na->g.M == 6 && na->g.K == 8 && na->g.N == 16 && na->g.out_ndim == 3 && na->g.out_shape[2] == 16);

    /* nf4_quantize: the payload's sizes */
    lpx_tensor *qx = nt(nc, LPX_F32, 2, (const int64_t[]){3, 100});
    lpx_value zv[3] = {lpx_v_tensor(qx), lpx_v_i64(64), lpx_v_i64(2)};
    lpx_call_init(&f.call, find("nf4_quantize"), zv, 3);
    f.call.key = nc_key;
    CHECK_OK(lpx_op_spec_run(&f, sizeof f));
    const lpx_nf4_quantize_args *za = &f.args.nf4_quantize;
    CHECK(za->sz.padded == 384 && za->sz.blocks == 6 && za->sz.scaler_blocks == 3 && za->block == 64);

    lpx_tensor *all[] = {x, s, x2, qt, st, sit, a, as, b, bs, ba, bas, bb, bbs, nx, codes, qs, fa, mean, qx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lpx_tensor_release(all[i]);
}

/* Tensor(host): a static scale (fp8_quantize) or scale_inv (fp8_dequantize)
 * may stay on the CPU while the other tensors are on the device; a scale
 * of an argument without the rule (fp8_scaled_mm's) is the dispatcher's
 * one-device refusal. */
static void test_host_scale(void)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    lpx_tensor *x = nt(nc, LPX_F32, 2, (const int64_t[]){2, 3}), *q = nt(nc, E4, 2, (const int64_t[]){2, 3});
    lpx_tensor *qt = nt(nc, E4, 2, (const int64_t[]){3, 2}), *hs = nt(lpx_cpu(), LPX_F32, 0, NULL);
    int before = reached;
    lpx_value qv[7] = {lpx_v_tensor(x), lpx_v_tensor(hs), lpx_v_dtype(E4), lpx_v_none(), lpx_v_bool(false),
                       lpx_v_f64(0), lpx_v_bool(true)};
    lpx_call c;
    lpx_call_init(&c, find("fp8_quantize"), qv, 7);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINTERNAL);   /* the check-free kernel ran */
    CHECK(reached == before + 1 && ((const lpx_fp8_quantize_args *)seen_args)->scale == hs);
    lpx_value dv[3] = {lpx_v_tensor(q), lpx_v_tensor(hs), lpx_v_dtype(LPX_F32)};
    lpx_call_init(&c, find("fp8_dequantize"), dv, 3);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINTERNAL);
    CHECK(reached == before + 2);
    lpx_value mv[7] = {lpx_v_tensor(q), lpx_v_tensor(hs), lpx_v_tensor(qt), lpx_v_tensor(hs), lpx_v_none(),
                       lpx_v_dtype(LPX_F32), lpx_v_bool(false)};
    lpx_call_init(&c, find("fp8_scaled_mm"), mv, 7);
    CHECK_ERR(lpx_dispatch(&c), LPX_EDEVICE);
    CHECK(reached == before + 2);
    lpx_tensor_release(x);
    lpx_tensor_release(q);
    lpx_tensor_release(qt);
    lpx_tensor_release(hs);
}

/* Checks that read data stay the kernels': on the CPU a static scale of 0
 * is refused by the kernel, as before the spec. */
static void test_data_checks_stay_in_kernels(void)
{
    lpx_tensor *x = NULL, *s = NULL;
    CHECK_OK(lpx_full(2, (const int64_t[]){2, 3}, 1.0, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_zeros(0, NULL, LPX_F32, lpx_cpu(), &s));
    lpx_value qv[7] = {lpx_v_tensor(x), lpx_v_tensor(s), lpx_v_dtype(E4), lpx_v_none(), lpx_v_bool(false),
                       lpx_v_f64(0), lpx_v_bool(true)};
    lpx_call c;
    lpx_call_init(&c, find("fp8_quantize"), qv, 7);
    CHECK_ERR(lpx_dispatch(&c), LPX_EINVAL);
    CHECK(!strcmp(lpx_last_error(), "fp8_quantize: static scale[0] = 0; a scale must be finite and > 0"));
    lpx_tensor_release(x);
    lpx_tensor_release(s);
}

int main(void)
{
    CHECK_OK(lpx_init());
    int with_spec = spec_setup();
    CHECK(with_spec >= 12);
    RUN(test_refused_by_dispatcher);
    RUN(test_views_refused);
    RUN(test_good_args_reach_kernel);
    RUN(test_normalised_args);
    RUN(test_host_scale);
    RUN(test_data_checks_stay_in_kernels);
    return CHECK_DONE();
}
