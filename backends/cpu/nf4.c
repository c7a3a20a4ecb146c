/* CPU kernels for the dense ops of ops_nf4.def: NF4 quantize (with double
 * quantization of the block scales), dequantize of any element range, the
 * tiled NF4 GEMM and the seeded dropout of the QLoRA adapter path.
 *
 * The scalar numerics (codebook, nearest code, scaler rounding) come from
 * core/numerics/nf4.h so that CUDA kernels and the tests share them.
 *
 * Speed notes (numbers in docs/PERFORMANCE.md, "lpx bench nf4"):
 * - quantize takes each block's absmax as an integer max over the bit
 *   patterns (which also catches NaN/inf) and finds each code with 15
 *   branch-free threshold compares on x / s (bit-identical to the argmin
 *   over the codebook, see nf4.h);
 * - dequantize builds, per block, the 16 scaled codebook values already
 *   encoded in the output dtype, then only looks codes up: no per-element
 *   arithmetic, and bit-identical to codebook[c] * scale per element;
 * - both have an AVX2 (+F16C) version chosen at run time, 16 codes per
 *   step; the portable version is tested to give the same bits;
 * - nf4_mm dequantizes W in tiles of rows into one f32 scratch buffer and
 *   hands each tile to cblas_sgemm, so W is never materialized whole. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "cpu_internal.h"
#include "../../core/dtype_internal.h"
#include "../../core/numerics/nf4.h"

/* the limits of include/lpx/nf4.h (the ops check them too: they are
 * reachable through dispatch without the kind) */
#define NF4_BLOCK_MAX LPX_NF4_BLOCK_MAX
/* f32 elements per dequantized tile of W in nf4_mm (4 MiB) */
#define NF4_TILE_ELEMS ((int64_t)1 << 20)
/* f32 elements of the quantize staging buffer (a whole number of blocks) */
#define NF4_STAGE_ELEMS 8192

/* ---- the payload ------------------------------------------------------- */

/* The four payload tensors of an NF4 op, checked for dtype, rank, layout
 * and mutual consistency. */
typedef struct nf4_payload {
    const uint8_t *codes;
    const int8_t *qs;
    const float *f;
    float mean;
    int64_t block, sblock;
    int64_t padded;      /* elements the codes cover */
} nf4_payload;

/* The payload the spec checked (lpx_nf4_payload_args: the contract is
 * lpx_meta_nf4_payload's), as the loops read it. */
static void payload_of(const lpx_nf4_payload_args *a, nf4_payload *p)
{
    p->codes = lpx_tensor_data(a->codes);
    p->qs = lpx_tensor_data(a->qscalers);
    p->f = lpx_tensor_data(a->factors);
    p->mean = *(const float *)lpx_tensor_data(a->mean);
    p->block = a->block;
    p->sblock = a->scaler_block;
    p->padded = a->padded;
}


/* ---- dequantize ---------------------------------------------------------- */

/* Dequantized scale of block b. */
static inline float block_scale(const nf4_payload *p, int64_t b)
{
    return lpx_nf4_scale(p->qs[b], p->f[b / p->sblock], p->mean);
}

/* Decodes elements [e0, e1) of one block (tab = its 16 scaled values in
 * the output type) to dst[0 .. e1-e0): a lone low nibble first when e0 is
 * odd, whole bytes in the middle, a lone high nibble last. `restrict`:
 * the table, the codes and the output never overlap, so the table stays in
 * registers across the stores. */
#define DEQ_SPAN_SCALAR(NAME, T)                                                          \
    static inline void NAME(const uint8_t *restrict codes, int64_t e0, int64_t e1,        \
                            const T *restrict tab, T *restrict dst)                       \
    {                                                                                     \
        int64_t e = e0;                                                                   \
        if (e & 1) { *dst++ = tab[lpx_nf4_lo(codes[e >> 1])]; e++; }                       \
        const uint8_t *cp = codes + (e >> 1);                                             \
        int64_t npairs = (e1 - e) >> 1;                                                   \
        for (int64_t j = 0; j < npairs; j++) {                                            \
            uint8_t byte = cp[j];                                                         \
            dst[2 * j] = tab[byte >> 4];                                                  \
            dst[2 * j + 1] = tab[byte & 15u];                                             \
        }                                                                                 \
        if (e + 2 * npairs < e1) dst[2 * npairs] = tab[lpx_nf4_hi(cp[npairs])];           \
    }
typedef uint16_t u16;
DEQ_SPAN_SCALAR(span_f32_scalar, float)
DEQ_SPAN_SCALAR(span_u16_scalar, u16)

/* Walks the blocks of [start, start + count): per block one dequantized
 * scale and a 16-entry table of scaled values encoded in the output dtype
 * (bit-identical to encoding codebook[c] * scale element by element), then
 * SPAN_F32 / SPAN_U16 decode the block's codes through it. */
#define DEQ_WALK(SPAN_F32, SPAN_U16, TAB_U16)                                             \
    do {                                                                                  \
        static const float cb[16] = {LPX_NF4_CODEBOOK_VALUES};                            \
        int64_t end = start + count, B = p->block;                                        \
        char *out = dst;                                                                  \
        size_t esz = dtype == LPX_F32 ? 4 : 2;                                            \
        for (int64_t e = start; e < end;) {                                               \
            int64_t b = e / B, e1 = (b + 1) * B < end ? (b + 1) * B : end;                 \
            float s = block_scale(p, b);                                                  \
            if (dtype == LPX_F32) {                                                       \
                float tab[16];                                                            \
                for (int k = 0; k < 16; k++) tab[k] = cb[k] * s;                          \
                SPAN_F32(p->codes, e, e1, tab, (float *)(void *)out);                     \
            } else {                                                                      \
                u16 tab[16];                                                              \
                TAB_U16(cb, s, dtype, tab);                                               \
                SPAN_U16(p->codes, e, e1, tab, (u16 *)(void *)out);                       \
            }                                                                             \
            out += (size_t)(e1 - e) * esz;                                                \
            e = e1;                                                                       \
        }                                                                                 \
    } while (0)

/* The 16 scaled values of a block encoded as bf16 or f16 (RNE). */
static inline void tab_u16_scalar(const float *cb, float s, lpx_dtype dtype, u16 *tab)
{
    for (int k = 0; k < 16; k++)
        tab[k] = dtype == LPX_BF16 ? lpx_f32_to_bf16(cb[k] * s, 0) : lpx_f32_to_f16(cb[k] * s, 0);
}

static void deq_range_scalar(const nf4_payload *p, int64_t start, int64_t count, lpx_dtype dtype, void *dst)
{
    DEQ_WALK(span_f32_scalar, span_u16_scalar, tab_u16_scalar);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NF4_HAVE_AVX2 1
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

/* AVX2 and F16C present (checked once: cpuid traps to the hypervisor in a
 * VM, far too slow per call). clang's __builtin_cpu_supports knows no
 * "f16c", so that bit is read from cpuid leaf 1 directly. */
static bool nf4_cpu_has_avx2(void)
{
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        v = f16c && __builtin_cpu_supports("avx2");
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

/* AVX2 spans (chosen at run time, so the library still runs on any
 * x86-64): 16 codes per step. f32: the nibbles index the 16-entry table as
 * two 8-lane permutes blended on bit 3. u16: the table is split into its
 * low and high bytes and looked up with byte shuffles. */
#define NF4_AVX2 __attribute__((target("avx2,f16c")))

NF4_AVX2 static inline __m128i nibbles16(const uint8_t *restrict cp)
{
    const __m128i m15 = _mm_set1_epi8(15);
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)cp);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m15), lo = _mm_and_si128(b, m15);
    return _mm_unpacklo_epi8(hi, lo);   /* element order: hi0 lo0 hi1 lo1 ... */
}

NF4_AVX2 static inline __m256 lookup8(__m256 t0, __m256 t1, __m256i idx)
{
    __m256 a = _mm256_permutevar8x32_ps(t0, idx), b = _mm256_permutevar8x32_ps(t1, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

NF4_AVX2 static inline void span_f32_avx2(const uint8_t *restrict codes, int64_t e0, int64_t e1,
                                          const float *restrict tab, float *restrict dst)
{
    int64_t e = e0;
    if (e & 1) { *dst++ = tab[lpx_nf4_lo(codes[e >> 1])]; e++; }
    __m256 t0 = _mm256_loadu_ps(tab), t1 = _mm256_loadu_ps(tab + 8);
    for (; e + 16 <= e1; e += 16, dst += 16) {
        __m128i idx = nibbles16(codes + (e >> 1));
        _mm256_storeu_ps(dst, lookup8(t0, t1, _mm256_cvtepu8_epi32(idx)));
        _mm256_storeu_ps(dst + 8, lookup8(t0, t1, _mm256_cvtepu8_epi32(_mm_srli_si128(idx, 8))));
    }
    span_f32_scalar(codes, e, e1, tab, dst);
}

NF4_AVX2 static inline void span_u16_avx2(const uint8_t *restrict codes, int64_t e0, int64_t e1,
                                          const u16 *restrict tab, u16 *restrict dst)
{
    int64_t e = e0;
    if (e & 1) { *dst++ = tab[lpx_nf4_lo(codes[e >> 1])]; e++; }
    __m128i t = _mm_loadu_si128((const __m128i *)(const void *)tab);
    __m128i t2 = _mm_loadu_si128((const __m128i *)(const void *)(tab + 8));
    /* byte tables: low bytes of the 16 entries, high bytes */
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    __m128i tlo = _mm_unpacklo_epi64(_mm_shuffle_epi8(t, even), _mm_shuffle_epi8(t2, even));
    __m128i thi = _mm_unpacklo_epi64(_mm_shuffle_epi8(t, odd), _mm_shuffle_epi8(t2, odd));
    for (; e + 16 <= e1; e += 16, dst += 16) {
        __m128i idx = nibbles16(codes + (e >> 1));
        __m128i lo = _mm_shuffle_epi8(tlo, idx), hi = _mm_shuffle_epi8(thi, idx);
        _mm_storeu_si128((__m128i *)(void *)dst, _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128((__m128i *)(void *)(dst + 8), _mm_unpackhi_epi8(lo, hi));
    }
    span_u16_scalar(codes, e, e1, tab, dst);
}

/* tab_u16_scalar, 8 lanes at a time: bf16 by the same add-and-truncate
 * rounding as lpx_f32_to_bf16 (the values are finite), f16 by the F16C
 * instruction in round-to-nearest-even, which is the IEEE conversion
 * lpx_f32_to_f16 computes. */
NF4_AVX2 static inline void tab_u16_avx2(const float *cb, float s, lpx_dtype dtype, u16 *tab)
{
    __m256 sv = _mm256_set1_ps(s);
    __m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(cb), sv), v1 = _mm256_mul_ps(_mm256_loadu_ps(cb + 8), sv);
    if (dtype == LPX_F16) {
        _mm_storeu_si128((__m128i *)(void *)tab, _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT));
        _mm_storeu_si128((__m128i *)(void *)(tab + 8), _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT));
        return;
    }
    const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    __m256i u0 = _mm256_castps_si256(v0), u1 = _mm256_castps_si256(v1);
    u0 = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u0, bias), _mm256_and_si256(_mm256_srli_epi32(u0, 16), one)), 16);
    u1 = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u1, bias), _mm256_and_si256(_mm256_srli_epi32(u1, 16), one)), 16);
    /* packus interleaves the 128-bit lanes: put them back in order */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u0, u1), 0xD8);
    _mm256_storeu_si256((__m256i *)(void *)tab, packed);
}

NF4_AVX2 static void deq_range_avx2(const nf4_payload *p, int64_t start, int64_t count, lpx_dtype dtype, void *dst)
{
    DEQ_WALK(span_f32_avx2, span_u16_avx2, tab_u16_avx2);
}
#endif

/* Test hook: 0 forces the portable scalar decode, so tests cover both
 * paths on AVX2 machines. Not API. */
extern int lpx__nf4_simd;
int lpx__nf4_simd = 1;

/* Decodes elements [start, start + count) of p into dst (dtype f32, f16 or
 * bf16, contiguous). */
static void deq_range(const nf4_payload *p, int64_t start, int64_t count, lpx_dtype dtype, void *dst)
{
#ifdef NF4_HAVE_AVX2
    if (lpx__nf4_simd && nf4_cpu_has_avx2()) {
        deq_range_avx2(p, start, count, dtype, dst);
        return;
    }
#endif
    deq_range_scalar(p, start, count, dtype, dst);
}

static lpx_status k_nf4_dequantize(lpx_call *c)
{
    const lpx_nf4_dequantize_args *a = lpx_op_args_of(c);
    nf4_payload p;
    payload_of(&a->p, &p);
    int64_t start = a->start, count = a->count;
    lpx_dtype dtype = a->dtype;
    lpx_tensor *out = a->out;
    lpx_status st;
    if (out) {
        lpx_tensor_retain(out);
    } else if ((st = cpu_new(c, dtype, 1, &count, &out))) {
        return st;
    }
    deq_range(&p, start, count, dtype, lpx_tensor_data(out));
    cpu_ret(c, out);
    return LPX_OK;
}

/* ---- quantize ------------------------------------------------------------ */

/* Quantizes nblocks whole blocks of B f32 values at x: block absmax into
 * scales[], packed codes into dst. Returns the index of the first block
 * holding NaN or inf (nothing after it is written), or -1.
 *
 * The absmax is taken on the bit patterns with the sign cleared: for
 * non-negative floats the integer order is the float order, and NaN/inf
 * sort above every finite value, so one vectorizable integer max gives
 * both the scale and the finiteness check. Codes: x / s (a true f32
 * division, as the recipe says) through lpx_nf4_encode's threshold
 * compares. Instantiated twice, portable and AVX2 (run-time choice). */
#define NF4_QUANTIZE_BLOCKS(NAME, ATTR)                                                   \
    ATTR static int64_t NAME(const float *restrict x, int64_t nblocks, int64_t B,         \
                             float *restrict scales, uint8_t *restrict dst)               \
    {                                                                                     \
        uint8_t codes[NF4_BLOCK_MAX];                                                     \
        for (int64_t b = 0; b < nblocks; b++, x += B, dst += B / 2) {                     \
            uint32_t mb = 0;                                                              \
            for (int64_t j = 0; j < B; j++) {                                             \
                uint32_t u = lpx_f32_bits(x[j]) & 0x7FFFFFFFu;                            \
                mb = u > mb ? u : mb;                                                     \
            }                                                                             \
            if (mb >= 0x7F800000u) return b;                                              \
            float s = lpx_f32_from_bits(mb);                                              \
            scales[b] = s;                                                                \
            if (s > 0.0f) {                                                               \
                for (int64_t j = 0; j < B; j++) codes[j] = (uint8_t)lpx_nf4_encode(x[j] / s); \
            } else {                                                                      \
                for (int64_t j = 0; j < B; j++) codes[j] = LPX_NF4_ZERO_CODE;             \
            }                                                                             \
            for (int64_t j = 0; j < B / 2; j++) dst[j] = lpx_nf4_pack(codes[2 * j], codes[2 * j + 1]); \
        }                                                                                 \
        return -1;                                                                        \
    }

NF4_QUANTIZE_BLOCKS(quantize_blocks_scalar, )

#ifdef NF4_HAVE_AVX2
/* lpx_nf4_encode on 8 lanes: each compare gives -1 or 0 per lane,
 * subtracting them counts the thresholds at or below v (2 ops per
 * threshold instead of the 3 the compiler emits for the C loop). */
NF4_AVX2 static inline __m256i encode8(__m256 v)
{
    static const float t[15] = {LPX_NF4_THRESHOLD_VALUES};
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < 15; i++)
        acc = _mm256_sub_epi32(acc, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_set1_ps(t[i]), _CMP_GE_OQ)));
    return acc;
}

/* quantize_blocks_scalar with the codes computed 16 at a time (B is even
 * but need not be a multiple of 16: the rest goes through the scalar
 * encode). */
NF4_AVX2 static int64_t quantize_blocks_avx2(const float *restrict x, int64_t nblocks, int64_t B,
                                             float *restrict scales, uint8_t *restrict dst)
{
    uint8_t codes[NF4_BLOCK_MAX];
    for (int64_t b = 0; b < nblocks; b++, x += B, dst += B / 2) {
        uint32_t mb = 0;
        for (int64_t j = 0; j < B; j++) {
            uint32_t u = lpx_f32_bits(x[j]) & 0x7FFFFFFFu;
            mb = u > mb ? u : mb;
        }
        if (mb >= 0x7F800000u) return b;
        float s = lpx_f32_from_bits(mb);
        scales[b] = s;
        int64_t j = 0;
        if (s > 0.0f) {
            __m256 sv = _mm256_set1_ps(s);
            for (; j + 16 <= B; j += 16) {
                __m256i c0 = encode8(_mm256_div_ps(_mm256_loadu_ps(x + j), sv));
                __m256i c1 = encode8(_mm256_div_ps(_mm256_loadu_ps(x + j + 8), sv));
                /* 16 x i32 -> 16 x u8 in order (packs interleave the 128-bit lanes) */
                __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xD8);
                __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
                _mm_storeu_si128((__m128i *)(void *)(codes + j), bytes);
            }
            for (; j < B; j++) codes[j] = (uint8_t)lpx_nf4_encode(x[j] / s);
        } else {
            for (; j < B; j++) codes[j] = LPX_NF4_ZERO_CODE;
        }
        for (j = 0; j < B / 2; j++) dst[j] = lpx_nf4_pack(codes[2 * j], codes[2 * j + 1]);
    }
    return -1;
}
#endif

static int64_t quantize_blocks(const float *x, int64_t nblocks, int64_t B, float *scales, uint8_t *dst)
{
#ifdef NF4_HAVE_AVX2
    if (lpx__nf4_simd && nf4_cpu_has_avx2())
        return quantize_blocks_avx2(x, nblocks, B, scales, dst);
#endif
    return quantize_blocks_scalar(x, nblocks, B, scales, dst);
}

static lpx_status nonfinite_error(const lpx_call *c, const float *x, int64_t n, int64_t base)
{
    for (int64_t j = 0; j < n; j++)
        if (!(fabsf(x[j]) <= FLT_MAX))
            return lpx_error(LPX_ENUMERIC, "%s: x[%lld] (flat index) is %s; NF4 quantizes finite values only",
                             cpu_op_name(c), (long long)(base + j), isnan(x[j]) ? "NaN" : x[j] > 0 ? "inf" : "-inf");
    return lpx_error(LPX_EINTERNAL, "%s: non-finite value not found again", cpu_op_name(c));
}

/* Second stage (double quantization): mean of the block scales, then per
 * scaler block the i8 scalers and the f32 factor. */
static void quantize_scalers(const float *s, int64_t nb, int64_t sblock, int8_t *qs, float *f, float *mean)
{
    double sum = 0.0;
    for (int64_t b = 0; b < nb; b++) sum += s[b];   /* block order, in double */
    float m = nb ? (float)(sum / (double)nb) : 0.0f;
    *mean = m;
    for (int64_t g = 0; g < nb / sblock; g++) {
        const float *sg = s + g * sblock;
        float amax = 0.0f;
        for (int64_t k = 0; k < sblock; k++) {
            float a = fabsf(sg[k] - m);
            amax = a > amax ? a : amax;
        }
        float fac = lpx_nf4_factor(amax);
        f[g] = fac;
        for (int64_t k = 0; k < sblock; k++) qs[g * sblock + k] = lpx_nf4_quantize_scaler(sg[k] - m, fac);
    }
}

static lpx_status k_nf4_quantize(lpx_call *c)
{
    const lpx_nf4_quantize_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    int64_t B = a->block, S = a->scaler_block;
    lpx_status st;
    const lpx_nf4_sizes sz = a->sz;
    int64_t n = x->numel, padded = sz.padded, nb = sz.blocks;
    int64_t shapes[4] = {padded / 2, nb, sz.scaler_blocks, 1};
    lpx_dtype dts[4] = {LPX_U8, LPX_I8, LPX_F32, LPX_F32};
    lpx_tensor *r[4] = {NULL, NULL, NULL, NULL};
    float *scales = lpx_malloc((size_t)(nb ? nb : 1) * sizeof(float));
    float *stage = lpx_malloc(NF4_STAGE_ELEMS * sizeof(float));
    if (!scales || !stage) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate %lld block scales", cpu_op_name(c), (long long)nb);
        goto fail;
    }
    for (int i = 0; i < 4; i++)
        if ((st = cpu_new(c, dts[i], 1, &shapes[i], &r[i]))) goto fail;
    uint8_t *codes = lpx_tensor_data(r[0]);
    cpu_view v;
    cpu_view_of(&v, x);
    const float *direct = cpu_view_f32(&v);
    /* staging: a whole number of blocks of x as f32, zero past the end */
    int64_t chunk = NF4_STAGE_ELEMS / B * B;
    for (int64_t e = 0; e < padded; e += chunk) {
        int64_t len = padded - e < chunk ? padded - e : chunk;
        int64_t avail = n - e > len ? len : (n > e ? n - e : 0);
        const float *src;
        if (direct && avail == len) {
            src = direct + e;
        } else {
            if (avail > 0) cpu_load_f32(&v, e, avail, stage);
            memset(stage + avail, 0, (size_t)(len - avail) * sizeof(float));
            src = stage;
        }
        int64_t bad = quantize_blocks(src, len / B, B, scales + e / B, codes + e / 2);
        if (bad >= 0) {
            st = nonfinite_error(c, src + bad * B, B, e + bad * B);
            goto fail;
        }
    }
    quantize_scalers(scales, nb, S, lpx_tensor_data(r[1]), lpx_tensor_data(r[2]), lpx_tensor_data(r[3]));
    lpx_free(scales);
    lpx_free(stage);
    for (int i = 0; i < 4; i++) cpu_ret(c, r[i]);
    return LPX_OK;
fail:
    lpx_free(scales);
    lpx_free(stage);
    for (int i = 0; i < 4; i++) lpx_tensor_release(r[i]);
    return st;
}

/* ---- GEMM with an NF4 matrix ----------------------------------------------- */

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* y [M, N] = x [M, K] @ op(W) (+ bias), W [rows, cols] decoded in tiles of
 * rows into `tile`. transpose_w: op(W) = W^T, K = cols, N = rows, a tile of
 * rows is a block of columns of y; else op(W) = W, K = rows, N = cols, a
 * tile is a block of the K dimension, accumulated into y. */
static void nf4_gemm(const nf4_payload *p, const float *x, int64_t M, int64_t rows, int64_t cols, bool tw,
                     const float *bias, float *y, float *tile, int64_t tile_rows)
{
    int64_t K = tw ? cols : rows, N = tw ? rows : cols;
    if (bias) {
        for (int64_t i = 0; i < M; i++) memcpy(y + i * N, bias, (size_t)N * sizeof(float));
    } else if (K == 0 || !tw) {
        memset(y, 0, (size_t)(M * N) * sizeof(float));
    }
    if (K == 0) return; /* y = bias (or 0); BLAS refuses lda = 0 */
    for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
        int64_t n = rows - r0 < tile_rows ? rows - r0 : tile_rows;
        deq_range(p, r0 * cols, n * cols, LPX_F32, tile);
        if (tw)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)n, (int)K, 1.0f, x, (int)K, tile,
                        (int)cols, bias ? 1.0f : 0.0f, y + r0, (int)N);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)n, 1.0f, x + r0, (int)K,
                        tile, (int)cols, 1.0f, y, (int)N);
    }
}

static lpx_status k_nf4_mm(lpx_call *c)
{
    const lpx_nf4_mm_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x, *bias = a->bias;
    nf4_payload p;
    payload_of(&a->p, &p);
    lpx_status st;
    const char *op = cpu_op_name(c);
    int64_t rows = a->rows, cols = a->cols;
    bool tw = a->transpose_w;
    int64_t K = a->g.K, N = a->g.N, M = a->g.M;
    /* sgemm's int sizes: what this backend has no code for */
    if (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(cols))
        return lpx_error(LPX_ERANGE, "%s: M = %lld, N = %lld or K = %lld exceeds the BLAS int range", op,
                         (long long)M, (long long)N, (long long)K);
    int64_t oshape[LPX_MAX_DIMS];
    memcpy(oshape, x->shape, (size_t)x->ndim * sizeof *oshape);
    oshape[x->ndim - 1] = N;
    lpx_tensor *res = NULL, *xf = NULL;
    float *ybuf = NULL, *tile = NULL, *bbuf = NULL;
    bool direct = x->dtype == LPX_F32;   /* sgemm writes the result itself */
    if ((st = cpu_new(c, x->dtype, x->ndim, oshape, &res))) return st;
    if (M == 0 || N == 0) {
        cpu_ret(c, res);
        return LPX_OK;
    }
    if ((st = cpu_contiguous_f32(x, &xf))) goto done;
    int64_t tile_rows = cols ? NF4_TILE_ELEMS / cols : rows;
    if (tile_rows < 1) tile_rows = 1;
    if (tile_rows > rows) tile_rows = rows;
    ybuf = direct ? lpx_tensor_data(res) : lpx_malloc((size_t)(M * N) * sizeof(float));
    tile = lpx_malloc((size_t)(tile_rows * cols > 0 ? tile_rows * cols : 1) * sizeof(float));
    if (bias) bbuf = lpx_malloc((size_t)N * sizeof(float));
    if (!ybuf || !tile || (bias && !bbuf)) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate the dequantization tile (%lld x %lld f32)", op,
                       (long long)tile_rows, (long long)cols);
        goto done;
    }
    if (bias) {
        cpu_view bv;
        cpu_view_of(&bv, bias);
        cpu_load_f32(&bv, 0, N, bbuf);
    }
    nf4_gemm(&p, lpx_tensor_data(xf), M, rows, cols, tw, bbuf, ybuf, tile, tile_rows);
    if (!direct) {
        cpu_view ov;
        cpu_view_of(&ov, res);
        cpu_store_f32(&ov, 0, M * N, ybuf, 0);
    }
done:
    if (!direct) lpx_free(ybuf);
    lpx_free(tile);
    lpx_free(bbuf);
    lpx_tensor_release(xf);
    if (st) {
        lpx_tensor_release(res);
        return st;
    }
    cpu_ret(c, res);
    return LPX_OK;
}

/* ---- dropout of the adapter path --------------------------------------------- */

static lpx_status k_qlora_dropout(lpx_call *c)
{
    const lpx_qlora_dropout_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    double p = a->p;
    uint64_t seed = a->seed;
    lpx_dtype dtype = a->dtype;
    lpx_status st;
    lpx_tensor *y;
    if ((st = cpu_new(c, dtype, x->ndim, x->shape, &y))) return st;
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const float inv = (float)(1.0 / (1.0 - p));
    cpu_view xv, yv;
    cpu_view_of(&xv, x);
    cpu_view_of(&yv, y);
    float buf[CPU_CHUNK];
    for (int64_t s = 0; s < x->numel; s += CPU_CHUNK) {
        int64_t n = x->numel - s < CPU_CHUNK ? x->numel - s : CPU_CHUNK;
        cpu_load_f32(&xv, s, n, buf);
        for (int64_t i = s; i < s + n;) {
            uint64_t k = (uint64_t)i >> 2;
            /* counter word 2 = 2: a stream apart from rand (1) and randn (0) */
            uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), 2u, 0u}, r[4];
            cpu_philox4x32_10(ctr, key, r);
            for (int w = (int)(i & 3); w < 4 && i < s + n; w++, i++) {
                double u = (double)(r[w] >> 8) * 0x1p-24;
                buf[i - s] = u >= p ? buf[i - s] * inv : 0.0f;
            }
        }
        cpu_store_f32(&yv, s, n, buf, 0);
    }
    cpu_ret(c, y);
    return LPX_OK;
}

lpx_status lpx_cpu_register_nf4(void)
{
    lpx_status st;
    if ((st = cpu_reg(LPX_OP_nf4_quantize, k_nf4_quantize))) return st;
    if ((st = cpu_reg(LPX_OP_nf4_dequantize, k_nf4_dequantize))) return st;
    if ((st = cpu_reg(LPX_OP_nf4_mm, k_nf4_mm))) return st;
    return cpu_reg(LPX_OP_qlora_dropout, k_qlora_dropout);
}
