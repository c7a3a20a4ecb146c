/* Low-precision optimizer states (issue 37): scalar numerics of AdamW with
 * quantized moments, shared by the CPU code, future CUDA kernels and the
 * tests. docs/NUMERICS.md "Optimizer states" is the prose version.
 *
 * Three state formats, each a pair (m, v) of blockwise-quantized arrays
 * with one f32 scale per block, as in torchao's torchao/optim:
 *
 *   8-bit  (AdamW8bit, bitsandbytes' blockwise 8-bit Adam): block 256;
 *          m: the signed dynamic map, v: the unsigned dynamic map (both
 *          bitsandbytes' create_dynamic_map, 256 codes); scale = absmax of
 *          the block clipped below at 1e-12; code = nearest map value of
 *          x / scale (rule below).
 *   4-bit  (AdamW4bit, Li et al. 2023 with torchao's choices): block 128;
 *          m: the signed dynamic map with 3 exponent bits and 4 bits in
 *          all (16 codes); v: the linear map (c + 1) / 16, c = 0..15 (no
 *          zero); two codes per byte, the first element in the high
 *          nibble (as torchao and lpx's nf4 pack them).
 *   fp8    m: e4m3fn codes of x / scale, scale = max(absmax, 1e-12) / 448
 *          (torchao's AdamWFp8), block 256. v: f16 codes of x / s with
 *          s = max(absmax, 1e-30) * 2^-15 per block of 256 (FP8-LM's fp16
 *          second moment with scaling); lpx's choice over torchao's e4m3 v
 *          and over bf16, docs/NUMERICS.md "Optimizer states".
 *          LPX_OS_STATE_FP8_E4M3V (lpx_os_adamwfp8_e4m3v_block) is
 *          torchao's e4m3 v, for comparisons.
 *
 * Code maps. The dynamic map of E exponent bits (bitsandbytes' construction,
 * "8-Bit Approximations for Parallelism in Deep Learning"): decade
 * i = 0..E-1 holds the midpoints of consecutive points of
 * linspace(0.1, 1, n_i + 1) times 10^(i - E + 1), n_i = 2^i (signed) or
 * 2^(i + 1) (unsigned); a signed map adds their negatives; both add 0 and
 * 1.0 and are sorted ascending. The values are those torch computes in f32
 * (torchao builds the lists with torch.linspace in f32 and multiplies by
 * the decade as an f32 scalar): linspace point k of N is
 *   k < N/2 ? fmaf(step, k, 0.1f) : fmaf(-step, N - 1 - k, 1.0f),
 *   step = (1.0f - 0.1f) / (N - 1),
 * the midpoint (b_k + b_{k+1}) / 2 and the value (float)10^(i-E+1) * mid,
 * every operation one f32 rounding (the fused multiply-add one rounding:
 * torch's kernel is FMA-contracted; tests/python/optim_vs_torchao.py
 * checks all 544 values bit-equal to torchao's qmaps). Layout: signed 8-bit: codes 0..126
 * the negatives (most negative first; code 0 is -0.99296875, there is no
 * -1), 127 is 0, 128..254 the positives, 255 is 1.0; unsigned 8-bit: 0 is
 * 0, 1..254 the positives, 255 is 1.0; signed 4-bit: 0..6, 7 = 0, 8..14,
 * 15 = 1.0.
 *
 * Encoding (torchao's quantize_8bit_with_qmap / quantize_4bit_with_qmap):
 * for v = x / scale (one f32 division), c = the largest code with
 * map[c] <= v (0 if none), then c + 1 instead when
 *   v - map[c] >= (map[c + 1] - map[c]) * 0.5f     (f32, c + 1 <= last)
 * i.e. the nearest map value, an exact f32 tie going to the larger code.
 * A NaN v gives code 0 (and its block's absmax, hence scale, is NaN).
 * Dequantization: map[c] * scale, one f32 multiplication.
 *
 * The AdamW step (lpx_os_adamw_elem) is lpx's f32 AdamW exactly:
 * backends/cpu/optim.c and lpx_meta_adamw's constants:
 *   m = b1 * m + omb1 * g;  v = b2 * v + omb2 * g * g;
 *   p = p * decay - lr * (m / bc1) / (sqrtf(v / bc2) + eps)
 * with b1, omb1 = 1 - b1, b2, omb2, lr, eps, decay = 1 - lr * wd,
 * bc1 = 1 - b1^t, bc2 = 1 - b2^t computed in double and rounded to f32.
 * The block steps dequantize m and v, apply it per element, write the
 * parameter with the f32 moments (as torchao does) and requantize m and v
 * with fresh block scales. (torchao's own step is ordered differently,
 * e.g. lerp and sqrt(v) / sqrt(bc2): docs/NUMERICS.md lists the
 * differences.)
 *
 * Masters. f32; bf16 with stochastic rounding (lpx_os_bf16_sr: round away
 * from zero with probability (low 16 bits) / 2^16, torchao's
 * _fp32_to_bf16_sr); or FP8-LM's scaled f16 (lpx_os_f16s_*: per-block
 * scale s = absmax * 2^-15, codes f16(x / s), RNE or stochastic). Random bits
 * come from Philox4x32-10 keyed by (seed, rank, step, element index):
 * lpx_os_rand32, so a run replays bit for bit on any thread count or device.
 *
 * Everything is plain C11 and f32 arithmetic with one rounding per
 * operation: build with FP contraction off (C11 mode does; the CUDA
 * plugin builds with --fmad=false). */
#ifndef LPX_NUMERICS_OPTIM_STATE_H
#define LPX_NUMERICS_OPTIM_STATE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "hd.h"
#include "bits.h"
#include "half.h"
#include "float8.h"

/* ---- block sizes (torchao's defaults) and scale constants -------------- */

#define LPX_OS8_BLOCK 256    /* AdamW8bit block_size */
#define LPX_OS4_BLOCK 128    /* AdamW4bit block_size */
#define LPX_OSFP8_BLOCK 256  /* AdamWFp8 block_size; also the f16 v's */
#define LPX_OS_BLOCK_MAX 256 /* the largest block a block step accepts */
#define LPX_OS_SCALE_MIN 1e-12f /* torchao clips the absmax at 1e-12 */
#define LPX_OS_E4M3_MAX 448.0f
#define LPX_OS_F16S_MIN 1e-30f  /* the scaled-f16 blocks clip their absmax here */

/* ---- code maps ----------------------------------------------------------- */

enum {
    LPX_OS_MAP8_SIGNED = 0,   /* 8-bit m: dynamic map, 7 exponent bits, signed */
    LPX_OS_MAP8_UNSIGNED = 1, /* 8-bit v: dynamic map, 7 exponent bits, unsigned */
    LPX_OS_MAP4_SIGNED = 2,   /* 4-bit m: dynamic map, 3 exponent bits, signed */
    LPX_OS_MAP4_UNSIGNED = 3  /* 4-bit v: (c + 1) / 16 */
};

/** Number of code bits of map `map` (8 or 4). */
static inline LPX_HD int lpx_os_map_bits(int map) { return map <= LPX_OS_MAP8_UNSIGNED ? 8 : 4; }

/** Point k of torch.linspace(0.1, 1, N) in f32 as torch's CPU kernel
 *  computes it: start + step * k (first half) and end - step * (N-1-k)
 *  each as ONE fused multiply-add (the kernel is built with FMA
 *  contraction in the AVX2/AVX-512 builds x86-64 dispatches to, and on
 *  aarch64), so fmaf, which is exact on the host and the device alike. */
static inline LPX_HD float lpx_os_linspace_(int N, int k)
{
    const float start = 0.1f, end = 1.0f;
    const float step = (end - start) / (float)(N - 1);
    return k < N / 2 ? fmaf(step, (float)k, start) : fmaf(-step, (float)(N - 1 - k), end);
}

/** Positive entry p (0-based, ascending) of a dynamic map with E exponent
 *  bits; `per` is 1 for the signed map (decade i holds 2^i values), 2 for
 *  the unsigned one (2^(i + 1) values). */
static inline LPX_HD float lpx_os_dynmap_pos_(int E, int per, int p)
{
    /* 10^-6 .. 10^0 as python computes 10 ** e (a correctly rounded
     * double), converted to f32 by torch's scalar multiplication */
    const double dec[7] = {1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6};
    int i = 0, first = 0;
    while (p >= first + (per << i)) {
        first += per << i;
        i++;
    }
    int n = per << i, j = p - first;
    float mid = (lpx_os_linspace_(n + 1, j) + lpx_os_linspace_(n + 1, j + 1)) / 2.0f;
    return (float)dec[E - 1 - i] * mid;
}

/** Value of code c of map `map` (c < 2^bits). Computed from the
 *  construction (no table): kernels build a table once with
 *  lpx_os_map_fill and index it. */
static inline LPX_HD float lpx_os_map_value(int map, unsigned c)
{
    switch (map) {
    case LPX_OS_MAP8_SIGNED: /* 127 negatives, 0, 127 positives, 1 */
    case LPX_OS_MAP4_SIGNED: {
        int E = map == LPX_OS_MAP8_SIGNED ? 7 : 3;
        int P = (1 << E) - 1; /* positives below 1.0; also the zero code */
        int k = (int)c;
        if (k == 2 * P + 1) return 1.0f;
        if (k == P) return 0.0f;
        return k > P ? lpx_os_dynmap_pos_(E, 1, k - P - 1) : -lpx_os_dynmap_pos_(E, 1, P - 1 - k);
    }
    case LPX_OS_MAP8_UNSIGNED: /* 0, 254 positives, 1 */
        if (c == 0) return 0.0f;
        if (c == 255) return 1.0f;
        return lpx_os_dynmap_pos_(7, 2, (int)c - 1);
    default: /* LPX_OS_MAP4_UNSIGNED: torch.linspace(0, 1, 17)[1:], exact */
        return (float)(c + 1) / 16.0f;
    }
}

/** Writes the 2^bits values of map `map` to out (256 or 16 floats). */
static inline LPX_HD void lpx_os_map_fill(int map, float *out)
{
    unsigned n = 1u << lpx_os_map_bits(map);
    for (unsigned c = 0; c < n; c++) out[c] = lpx_os_map_value(map, c);
}

/** Code of v in the ascending table q of 2^bits values, torchao's rule
 *  (file comment): the nearest value, exact f32 ties to the larger code,
 *  NaN to code 0. */
static inline LPX_HD unsigned lpx_os_encode(const float *q, int bits, float v)
{
    unsigned c = 0, last = (1u << bits) - 1u;
    for (int b = bits - 1; b >= 0; b--) {
        unsigned t = c + (1u << b);
        if (v >= q[t]) c = t;
    }
    unsigned up = c < last ? c + 1u : last;
    float lo = q[c], hi = q[up];
    return v - lo >= (hi - lo) * 0.5f ? up : c;
}

/* ---- block scales ------------------------------------------------------- */

/** The absmax as a running reduction, one element at a time (the block
 *  functions below and the CUDA kernel's warp reduction share it): *a the
 *  largest |x| so far (start 0), *nan set when an x is NaN. Combining two
 *  partial (a, nan) pairs with lpx_os_absmax_merge gives the same result
 *  in any order (a maximum of non-NaN values is exact). */
static inline LPX_HD void lpx_os_absmax_acc(float *a, int *nan, float x)
{
    float v = fabsf(x);
    *nan |= v != v;
    *a = v > *a ? v : *a;
}

static inline LPX_HD void lpx_os_absmax_merge(float *a, int *nan, float a2, int nan2)
{
    *nan |= nan2;
    *a = a2 > *a ? a2 : *a;
}

/** The absmax of a finished reduction: NaN if any element was. */
static inline LPX_HD float lpx_os_absmax_fin(float a, int nan)
{
    return nan ? lpx_f32_from_bits(0x7FC00000u) : a;
}

/** Absmax of x[0..n), NaN if any element is NaN (torch's amax). */
static inline LPX_HD float lpx_os_absmax(const float *x, int n)
{
    float a = 0.0f;
    int nan = 0;
    for (int i = 0; i < n; i++) lpx_os_absmax_acc(&a, &nan, x[i]);
    return lpx_os_absmax_fin(a, nan);
}

/** The scale of a code-map block: absmax clipped below at 1e-12
 *  (torchao's scale_tensor; NaN stays NaN). */
static inline LPX_HD float lpx_os_map_scale(float absmax)
{
    return absmax < LPX_OS_SCALE_MIN ? LPX_OS_SCALE_MIN : absmax;
}

/** The scale of an e4m3 block: max(absmax, 1e-12) / 448 (f32 division),
 *  torchao's quantize_fp8. */
static inline LPX_HD float lpx_os_e4m3_scale(float absmax)
{
    return lpx_os_map_scale(absmax) / LPX_OS_E4M3_MAX;
}

/** The scale of a scaled-f16 block (FP8-LM's f16 with scaling):
 *  s = max(absmax, 1e-30) * 2^-15 (exact), so the block's absmax element
 *  is exactly 2^15 in f16 and the others keep f16's 11 bits down to
 *  absmax * 2^-29 (subnormals to absmax * 2^-39), far from f16's overflow
 *  (65504). Scaling with the absmax, not a power of two near it, lets a
 *  uniform decay of the block (v with zero grads, weight decay) move the
 *  scale instead of being rounded away in every code. NaN stays NaN. */
static inline LPX_HD float lpx_os_f16s_scale(float absmax)
{
    return (absmax < LPX_OS_F16S_MIN ? LPX_OS_F16S_MIN : absmax) * 0x1p-15f;
}

/* ---- Philox4x32-10 and the stochastic-rounding bits -------------------- */

/** Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11), the generator of
 *  backends/cpu/creation.c (cpu_philox4x32_10), cuRAND and PyTorch's CUDA
 *  backend: a bijection of the 128-bit counter under the 64-bit key. */
static inline LPX_HD void lpx_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0, c1 = (uint32_t)p1, c2 = n2, c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/** The 32 random bits of element `index` at optimizer step `step` on rank
 *  `rank` of a run seeded `seed`: word index % 4 of Philox4x32-10 with
 *  counter (index / 4 low, high, step low 32 bits, rank) and key (seed
 *  low, high). `index` is the element's position in whatever flat space
 *  the caller fixes (the engine: its offset in the rank's shard of the
 *  flat parameter space, so two parameters never share bits). */
static inline LPX_HD void lpx_os_rand128(uint64_t seed, uint32_t rank, uint64_t step, uint64_t k, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), (uint32_t)step, rank};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    lpx_philox4x32_10(ctr, key, out);
}

/* (lpx_os_rand128 is the draw of the four elements 4k .. 4k + 3: word
 * index & 3 of lpx_os_rand128(..., index >> 2) is lpx_os_rand32(..., index),
 * so a kernel holding four consecutive elements draws once.) */
static inline LPX_HD uint32_t lpx_os_rand32(uint64_t seed, uint32_t rank, uint64_t step, uint64_t index)
{
    uint32_t out[4];
    lpx_os_rand128(seed, rank, step, index >> 2, out);
    return out[index & 3u];
}

/* ---- stochastic rounding ------------------------------------------------ */

/** f32 -> bf16 with stochastic rounding: round away from zero with
 *  probability (low 16 bits of x) / 2^16, i.e. when r16 < those bits
 *  (r16 uniform in [0, 2^16): the top 16 bits of lpx_os_rand32), else
 *  toward zero; torchao's _fp32_to_bf16_sr. Unbiased: E[result] = x.
 *  inf stays inf; NaN gives bf16's quiet NaN with x's sign; a value
 *  above bf16's largest finite rounds to it or (with the same law) to inf. */
static inline LPX_HD uint16_t lpx_os_bf16_sr(float x, uint32_t r16)
{
    uint32_t u = lpx_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(((u >> 16) & 0x8000u) | LPX_BF16_NAN);
    uint32_t t = u >> 16;
    return (uint16_t)(t + ((r16 & 0xFFFFu) < (u & 0xFFFFu) ? 1u : 0u));
}

/** f32 -> f16 with stochastic rounding: between the two f16 neighbours
 *  of x (the one toward zero and the next one away), away with
 *  probability (distance to the one toward zero) / (their gap), exactly
 *  when at most 32 bits are dropped (|x| >= 2^-33; below, the law is
 *  truncated to 32 bits: a bias under 2^-32 of a subnormal step). r32:
 *  lpx_os_rand32. A value above f16's largest finite (65504) rounds to
 *  it or to inf by the same law; inf stays inf, NaN gives f16's quiet NaN. */
static inline LPX_HD uint16_t lpx_os_f16_sr(float x, uint32_t r32)
{
    uint32_t u = lpx_f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | LPX_F16_NAN);
    if (a >= 0x47800000u) /* >= 2^16: beyond the largest finite's gap */
        return (uint16_t)(sign | LPX_F16_INF);
    int e = (int)(a >> 23) - 127; /* unbiased exponent; -127 for subnormal f32 */
    uint32_t m = (a & 0x7FFFFFu) | (a >> 23 ? 0x800000u : 0u);
    if (!(a >> 23)) e = -126;
    /* f16 step at x: 2^(max(e, -14) - 10); bits of m dropped: s */
    int s = 13 + (e < -14 ? -14 - e : 0);
    uint32_t q, rem, up;
    if (s >= 24 + 32) return (uint16_t)sign; /* < 2^-32 of the smallest step */
    if (s > 31) {                                /* q = 0; compare 32 bits */
        q = 0;
        up = r32 < (m >> (s - 32)) ? 1u : 0u;
    } else {
        q = s >= 24 ? 0u : m >> s;
        rem = m & ((1u << s) - 1u);
        up = (r32 >> (32 - s)) < rem ? 1u : 0u;
    }
    /* q counts f16 steps of 2^(max(e,-14)-10) below |x|; the code is
     * (exponent field << 10) + mantissa = that count plus the normal
     * offset, and a carry into the exponent is the right next code */
    uint32_t code = e < -14 ? q : ((uint32_t)(e + 15) << 10) + (q - 0x400u);
    code += up; /* 0x7BFF + 1 is inf, as the law demands */
    return (uint16_t)(sign | code);
}

/* ---- AdamW, lpx's f32 arithmetic ------------------------------------------ */

/** The f32 constants of one AdamW step (lpx_adamw_consts of lpx/meta.h,
 *  field for field). */
typedef struct lpx_os_adamw {
    float b1, omb1, b2, omb2, lr, eps, decay, bc1, bc2;
} lpx_os_adamw;

/** The constants for step t >= 1 exactly as lpx_meta_adamw computes them
 *  (double, rounded to f32). */
static inline LPX_HD lpx_os_adamw lpx_os_adamw_consts(double lr, double beta1, double beta2, double eps,
                                                     double weight_decay, int64_t step)
{
    lpx_os_adamw k;
    k.b1 = (float)beta1;
    k.omb1 = (float)(1.0 - beta1);
    k.b2 = (float)beta2;
    k.omb2 = (float)(1.0 - beta2);
    k.lr = (float)lr;
    k.eps = (float)eps;
    k.decay = (float)(1.0 - lr * weight_decay);
    k.bc1 = (float)(1.0 - pow(beta1, (double)step));
    k.bc2 = (float)(1.0 - pow(beta2, (double)step));
    return k;
}

/** One element of lpx's f32 AdamW: updates *m and *v, returns the new
 *  parameter. Bit for bit the CPU kernel's (backends/cpu/optim.c). */
static inline LPX_HD float lpx_os_adamw_elem(const lpx_os_adamw *k, float p, float g, float *m, float *v)
{
    float mm = k->b1 * *m + k->omb1 * g;
    float vv = k->b2 * *v + k->omb2 * g * g;
    float mh = mm / k->bc1, vh = vv / k->bc2;
    *m = mm;
    *v = vv;
    return p * k->decay - k->lr * mh / (sqrtf(vh) + k->eps);
}

/* ---- one element's codes (the block functions below are loops of these;
 * the CUDA kernel spreads them over a warp) ------------------------------ */

/** Code of x in table q (2^bits values) under block scale s. */
static inline LPX_HD unsigned lpx_os_enc_map(const float *q, int bits, float x, float s)
{
    return lpx_os_encode(q, bits, x / s);
}

/** Value of code c of table q under block scale s. */
static inline LPX_HD float lpx_os_dec_map(const float *q, unsigned c, float s) { return q[c] * s; }

/** Code i of a packed 4-bit block (high nibble for even i). */
static inline LPX_HD unsigned lpx_os_nibble(const uint8_t *packed, int i)
{
    return i & 1 ? packed[i / 2] & 15u : (unsigned)packed[i / 2] >> 4;
}

static inline LPX_HD uint8_t lpx_os_enc_e4m3(float x, float s) { return lpx_f32_to_f8e4m3fn(x / s, 0); }
static inline LPX_HD float lpx_os_dec_e4m3(uint8_t c, float s) { return lpx_f8e4m3fn_to_f32(c) * s; }
static inline LPX_HD uint16_t lpx_os_enc_f16s(float x, float s) { return lpx_f32_to_f16(x / s, 0); }
static inline LPX_HD float lpx_os_dec_f16s(uint16_t c, float s) { return lpx_f16_to_f32(c) * s; }

/** One bf16 stochastically rounded master element; r32: its bits
 *  (lpx_os_rand32 of its flat index). */
static inline LPX_HD uint16_t lpx_os_bf16_sr_elem(float p, uint32_t r32) { return lpx_os_bf16_sr(p, r32 >> 16); }

/** One scaled-f16 master element under block scale s (lpx_os_f16s_scale):
 *  stochastic with the bits r32 (lpx_os_rand32 of its flat index), or RNE
 *  (r32 unused). */
static inline LPX_HD uint16_t lpx_os_f16s_elem(float p, float s, int stochastic, uint32_t r32)
{
    return stochastic ? lpx_os_f16_sr(p / s, r32) : lpx_f32_to_f16(p / s, 0);
}

/* ---- quantize / dequantize one block ------------------------------------ */

/** 8-bit block: codes of x[0..n) in table q (256 values), returns the
 *  block's scale. */
static inline LPX_HD float lpx_os_quant8(const float *q, const float *x, int n, uint8_t *codes)
{
    float s = lpx_os_map_scale(lpx_os_absmax(x, n));
    for (int i = 0; i < n; i++) codes[i] = (uint8_t)lpx_os_enc_map(q, 8, x[i], s);
    return s;
}

static inline LPX_HD void lpx_os_dequant8(const float *q, const uint8_t *codes, float s, int n, float *x)
{
    for (int i = 0; i < n; i++) x[i] = lpx_os_dec_map(q, codes[i], s);
}

/** 4-bit block: element i in the high nibble of byte i/2 when i is even,
 *  the low one when odd; an odd n leaves the last low nibble 0. */
static inline LPX_HD float lpx_os_quant4(const float *q, const float *x, int n, uint8_t *packed)
{
    float s = lpx_os_map_scale(lpx_os_absmax(x, n));
    for (int i = 0; i < n; i += 2) {
        unsigned hi = lpx_os_enc_map(q, 4, x[i], s);
        unsigned lo = i + 1 < n ? lpx_os_enc_map(q, 4, x[i + 1], s) : 0u;
        packed[i / 2] = (uint8_t)((hi << 4) | lo);
    }
    return s;
}

static inline LPX_HD void lpx_os_dequant4(const float *q, const uint8_t *packed, float s, int n, float *x)
{
    for (int i = 0; i < n; i++) x[i] = lpx_os_dec_map(q, lpx_os_nibble(packed, i), s);
}

/** e4m3 block (fp8 m; torchao's quantize_fp8, RNE, non-saturating as
 *  torch's .to(float8_e4m3fn): x / scale never exceeds 448 by more than
 *  an ulp of f32, which rounds to 448). */
static inline LPX_HD float lpx_os_quant_e4m3(const float *x, int n, uint8_t *codes)
{
    float s = lpx_os_e4m3_scale(lpx_os_absmax(x, n));
    for (int i = 0; i < n; i++) codes[i] = lpx_os_enc_e4m3(x[i], s);
    return s;
}

static inline LPX_HD void lpx_os_dequant_e4m3(const uint8_t *codes, float s, int n, float *x)
{
    for (int i = 0; i < n; i++) x[i] = lpx_os_dec_e4m3(codes[i], s);
}

/** Scaled-f16 block (the fp8 kind's v, FP8-LM's master): f16 codes of
 *  x / s (one f32 division, then RNE); returns s (lpx_os_f16s_scale). */
static inline LPX_HD float lpx_os_quant_f16s(const float *x, int n, uint16_t *codes)
{
    float s = lpx_os_f16s_scale(lpx_os_absmax(x, n));
    for (int i = 0; i < n; i++) codes[i] = lpx_os_enc_f16s(x[i], s);
    return s;
}

static inline LPX_HD void lpx_os_dequant_f16s(const uint16_t *codes, float s, int n, float *x)
{
    for (int i = 0; i < n; i++) x[i] = lpx_os_dec_f16s(codes[i], s);
}

/* ---- fused AdamW steps over one block ------------------------------------
 * p[0..n) is the f32 parameter (the master, decoded by the caller: f32,
 * lpx_os_bf16 / lpx_os_f16s below), updated in place; g the f32 grad;
 * n <= the kind's block (the last block of a tensor may be shorter; its
 * absmax covers its n elements only). */

/** AdamW8bit: m codes (LPX_OS_MAP8_SIGNED table qm) with scale *ms, v
 *  codes (LPX_OS_MAP8_UNSIGNED table qv) with scale *vs. */
static inline LPX_HD void lpx_os_adamw8_block(const lpx_os_adamw *k, const float *qm, const float *qv, int n,
                                              float *p, const float *g, uint8_t *mc, float *ms, uint8_t *vc,
                                              float *vs)
{
    float m[LPX_OS_BLOCK_MAX], v[LPX_OS_BLOCK_MAX];
    lpx_os_dequant8(qm, mc, *ms, n, m);
    lpx_os_dequant8(qv, vc, *vs, n, v);
    for (int i = 0; i < n; i++) p[i] = lpx_os_adamw_elem(k, p[i], g[i], &m[i], &v[i]);
    *ms = lpx_os_quant8(qm, m, n, mc);
    *vs = lpx_os_quant8(qv, v, n, vc);
}

/** AdamW4bit: packed m codes (LPX_OS_MAP4_SIGNED), packed v codes
 *  (LPX_OS_MAP4_UNSIGNED), (n + 1) / 2 bytes each. */
static inline LPX_HD void lpx_os_adamw4_block(const lpx_os_adamw *k, const float *qm, const float *qv, int n,
                                              float *p, const float *g, uint8_t *mc, float *ms, uint8_t *vc,
                                              float *vs)
{
    float m[LPX_OS_BLOCK_MAX], v[LPX_OS_BLOCK_MAX];
    lpx_os_dequant4(qm, mc, *ms, n, m);
    lpx_os_dequant4(qv, vc, *vs, n, v);
    for (int i = 0; i < n; i++) p[i] = lpx_os_adamw_elem(k, p[i], g[i], &m[i], &v[i]);
    *ms = lpx_os_quant4(qm, m, n, mc);
    *vs = lpx_os_quant4(qv, v, n, vc);
}

/** The fp8 state (lpx's): e4m3 m with scale *ms, scaled-f16 v with
 *  scale *vs. */
static inline LPX_HD void lpx_os_adamwfp8_block(const lpx_os_adamw *k, int n, float *p, const float *g,
                                                uint8_t *mc, float *ms, uint16_t *vc, float *vs)
{
    float m[LPX_OS_BLOCK_MAX], v[LPX_OS_BLOCK_MAX];
    lpx_os_dequant_e4m3(mc, *ms, n, m);
    lpx_os_dequant_f16s(vc, *vs, n, v);
    for (int i = 0; i < n; i++) p[i] = lpx_os_adamw_elem(k, p[i], g[i], &m[i], &v[i]);
    *ms = lpx_os_quant_e4m3(m, n, mc);
    *vs = lpx_os_quant_f16s(v, n, vc);
}

/** torchao's AdamWFp8 state: e4m3 m and e4m3 v, each with its scale. */
static inline LPX_HD void lpx_os_adamwfp8_e4m3v_block(const lpx_os_adamw *k, int n, float *p, const float *g,
                                                      uint8_t *mc, float *ms, uint8_t *vc, float *vs)
{
    float m[LPX_OS_BLOCK_MAX], v[LPX_OS_BLOCK_MAX];
    lpx_os_dequant_e4m3(mc, *ms, n, m);
    lpx_os_dequant_e4m3(vc, *vs, n, v);
    for (int i = 0; i < n; i++) p[i] = lpx_os_adamw_elem(k, p[i], g[i], &m[i], &v[i]);
    *ms = lpx_os_quant_e4m3(m, n, mc);
    *vs = lpx_os_quant_e4m3(v, n, vc);
}

/* ---- masters ------------------------------------------------------------ */

/** Writes the f32 parameters p[0..n) as bf16 with stochastic rounding,
 *  element i drawing lpx_os_rand32(seed, rank, step, index0 + i) >> 16. */
static inline LPX_HD void lpx_os_bf16_sr_store(const float *p, int n, uint16_t *out, uint64_t seed, uint32_t rank,
                                               uint64_t step, uint64_t index0)
{
    for (int i = 0; i < n; i++) out[i] = lpx_os_bf16_sr_elem(p[i], lpx_os_rand32(seed, rank, step, index0 + (uint64_t)i));
}

/** Writes p[0..n) as a scaled-f16 master block (FP8-LM): returns the
 *  scale; codes f16(p / s) (f32 quotient) with stochastic rounding
 *  (lpx_os_rand32(seed, rank, step, index0 + i)) when `stochastic`, else
 *  RNE. Read back with lpx_os_dequant_f16s. */
static inline LPX_HD float lpx_os_f16s_store(const float *p, int n, uint16_t *codes, int stochastic, uint64_t seed,
                                             uint32_t rank, uint64_t step, uint64_t index0)
{
    float s = lpx_os_f16s_scale(lpx_os_absmax(p, n));
    for (int i = 0; i < n; i++)
        codes[i] = lpx_os_f16s_elem(p[i], s, stochastic,
                                    stochastic ? lpx_os_rand32(seed, rank, step, index0 + (uint64_t)i) : 0u);
    return s;
}

/* ---- layouts ------------------------------------------------------------- */

enum {
    LPX_OS_STATE_8BIT = 0,      /* AdamW8bit: u8 m, u8 v, f32 scale per 256 each */
    LPX_OS_STATE_4BIT = 1,      /* AdamW4bit: packed 4-bit m and v, f32 scale per 128 each */
    LPX_OS_STATE_FP8 = 2,       /* lpx fp8: e4m3 m, f16 v, f32 scale per 256 each */
    LPX_OS_STATE_FP8_E4M3V = 3  /* torchao AdamWFp8: e4m3 m and v, f32 scale per 256 each */
};

/** The default block of a state kind (torchao's). */
static inline LPX_HD int64_t lpx_os_state_block(int kind)
{
    return kind == LPX_OS_STATE_4BIT ? LPX_OS4_BLOCK : kind == LPX_OS_STATE_8BIT ? LPX_OS8_BLOCK : LPX_OSFP8_BLOCK;
}

/** Bytes of the (m, v) state of a numel-element parameter in blocks of
 *  `block` (the last block may be shorter): codes plus one f32 scale per
 *  block for each moment. Excludes the master and the grad. */
static inline LPX_HD int64_t lpx_os_state_bytes(int kind, int64_t numel, int64_t block)
{
    int64_t nb = (numel + block - 1) / block, scales = 2 * nb * 4;
    switch (kind) {
    case LPX_OS_STATE_8BIT: return 2 * numel + scales;
    case LPX_OS_STATE_4BIT: /* (n + 1) / 2 bytes per block of n */
        return 2 * (numel / block * ((block + 1) / 2) + (numel % block + 1) / 2) + scales;
    case LPX_OS_STATE_FP8: return numel + 2 * numel + scales;
    default: return 2 * numel + scales;
    }
}

#endif
