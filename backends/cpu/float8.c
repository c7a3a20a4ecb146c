/* CPU kernels for the dense ops of ops_float8.def: fused quantize,
 * dequantize and the scale formula.
 *
 * Quantize. Every scale group is either a contiguous run of x's logical
 * elements (tensorwise: the whole tensor; a reduced last dim: one row) or,
 * when the reduced dim is not the last one, a set of columns of an
 * [outer, D, inner] block. Dynamic scaling reads x twice (amax, then
 * encode) and static scaling once. The encoder is THE scalar codec of
 * core/numerics/float8.h, called per element in loops the compiler
 * vectorizes: per 256-element block, a fast loop encodes values
 * clamped into the format's normal range and tells the compiler that range
 * (so the codec's subnormal/overflow/NaN paths drop out of the vector
 * code), and a scalar fix-up pass re-encodes the rare elements outside it
 * with the full codec. On x86-64 the loops are also compiled for AVX2,
 * picked at run time. Bit-exact with the codec on every element (tested on
 * random bit patterns).
 *
 * Statistics: amax, zero and out-of-range counts come from the fast loop;
 * underflow, saturation and NaN can only occur out of range, so the
 * fix-up pass counts them, by thresholds on the scaled magnitude
 * |x * scale| (its f32 bits) found once per format by bisection over the
 * same codec: a value overflows iff its bits are >= T (the smallest
 * magnitude the non-saturating codec sends to NaN/inf), and a nonzero
 * value underflows iff its bits are <= U (the largest magnitude the codec
 * sends to 0). The codec is monotonic in the magnitude: these are exact.
 *
 * The scaled fp8 GEMM is float8_mm.c. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "../../core/dtype_internal.h"
#include "cpu_internal.h"

/* ---- format constants --------------------------------------------- */

/* f32 bits of each format's smallest normal and largest finite value
 * (checked against the decode tables at registration). Between them the
 * codec only takes its normal-range path: no subnormal, overflow or NaN
 * case. */
#define E4_LO 0x3C800000u   /* 2^-6 */
#define E4_HI 0x43E00000u   /* 448 */
#define E5_LO 0x38800000u   /* 2^-14 */
#define E5_HI 0x47600000u   /* 57344 */

/* Per fp8 format: largest finite value and the statistic thresholds on
 * f32 magnitude bits (see the file comment). */
typedef struct f8_format {
    lpx_dtype dtype;
    double max;
    uint32_t over_bits;   /* T: |y| bits >= T overflow */
    uint32_t zero_bits;   /* U: |y| bits <= U encode to +-0 */
} f8_format;

static f8_format fmt_e4m3, fmt_e5m2;

static uint8_t encode_nonsat(lpx_dtype d, uint32_t bits)
{
    float y = lpx_f32_from_bits(bits);
    return (d == LPX_F8E4M3FN ? lpx_f32_to_f8e4m3fn(y, 0) : lpx_f32_to_f8e5m2(y, 0)) & 0x7Fu;
}

static lpx_status format_init(f8_format *f, lpx_dtype d)
{
    bool e4 = d == LPX_F8E4M3FN;
    uint32_t max_code = e4 ? LPX_F8E4M3FN_MAX_CODE : LPX_F8E5M2_MAX_CODE;
    const lpx_f8_table *tab = e4 ? &lpx__f8e4m3fn_table : &lpx__f8e5m2_table;
    if (tab->u[e4 ? 0x08 : 0x04] != (e4 ? E4_LO : E5_LO) || tab->u[max_code] != (e4 ? E4_HI : E5_HI))
        return lpx_error(LPX_EINTERNAL, "float8 cpu kernels: the %s range constants disagree with the decode table",
                         lpx_dtype_name(d));
    f->dtype = d;
    f->max = lpx_dtype_get(d)->max;
    /* smallest bits that overflow: over(lo) false, over(hi) true */
    uint32_t lo = 0, hi = 0x7F800000u;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (encode_nonsat(d, mid) > max_code) hi = mid; else lo = mid;
    }
    f->over_bits = hi;
    /* largest bits that encode to zero: zero(lo) true, zero(hi) false */
    lo = 0, hi = 0x7F800000u;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (encode_nonsat(d, mid) == 0) lo = mid; else hi = mid;
    }
    f->zero_bits = lo;
    return LPX_OK;
}

static const f8_format *format_of(lpx_dtype d)
{
    return d == LPX_F8E4M3FN ? &fmt_e4m3 : d == LPX_F8E5M2 ? &fmt_e5m2 : NULL;
}

/* ---- the encode loops (compiled for the baseline ISA and for AVX2) -- */

/* Statistics of one encode call, summed over calls. */
typedef struct f8_counts {
    uint32_t amax_bits;   /* max |x| as f32 bits; > 0x7F800000: a NaN was seen */
    int64_t nonzero;      /* nonzero, non-NaN inputs */
    int64_t underflow;    /* of those, encoded to +-0 */
    int64_t saturated;    /* scaled magnitude overflowed (inf included) */
    int64_t nan;          /* NaN inputs */
} f8_counts;

/* Elements per block of the fast loop. Small, because a block with one
 * out-of-range element (an exact zero is not one) is scanned again by the
 * scalar fix-up pass: with Gaussian data and dynamic scaling about 1 in
 * 7000 elements is below the normal range, so 256-element blocks keep the
 * rescans to a few percent while the per-block reductions stay cheap. */
#define F8_BLOCK 256

#if defined(__GNUC__) || defined(__clang__)
#define F8_INLINE static inline __attribute__((always_inline))
#define F8_ASSUME(c) do { if (!(c)) __builtin_unreachable(); } while (0)
#else
#define F8_INLINE static inline
#define F8_ASSUME(c) ((void)0)
#endif

/* Encodes one element with the codec; fmt/sat are constants after
 * inlining, so each instantiation is straight-line code. */
F8_INLINE uint8_t f8_enc(float y, int e5m2, int sat)
{
    return e5m2 ? lpx_f32_to_f8e5m2(y, sat) : lpx_f32_to_f8e4m3fn(y, sat);
}

/* q[i] = fp8(x[i] * s) (vec == 0) or fp8(x[i] * sv[i]), with stats.
 *
 * Per block, a fast loop runs the codec on y clamped into the format's
 * normal range [lo, hi]: for those values the clamp is the identity, and
 * telling the compiler the range (F8_ASSUME, true by construction) lets it
 * drop the codec's subnormal/overflow/NaN paths, so the loop vectorizes to
 * a few instructions per element. Exact zeros take the codec's code for
 * +-0. Elements outside the range (tiny, huge, inf, NaN: rare under
 * dynamic scaling) are counted, and a scalar fix-up pass re-encodes them
 * with the full codec and computes the statistics that can only arise
 * there (underflow, saturation, NaN). Bit-exact with calling the codec on
 * every element. */
F8_INLINE void f8_encode_body(const float *restrict x, int64_t n, float s, const float *restrict sv,
                              uint8_t *restrict q, int e5m2, int vec, int sat, uint32_t over, uint32_t zero,
                              f8_counts *c)
{
    /* the range as literals: gcc folds the assumption below only when its
     * bounds are constants from the start */
#define F8_LO (e5m2 ? E5_LO : E4_LO)
#define F8_HI (e5m2 ? E5_HI : E4_HI)
    const uint8_t zpos = f8_enc(0.0f, e5m2, 1), zneg = f8_enc(-0.0f, e5m2, 1);
    for (int64_t b = 0; b < n; b += F8_BLOCK) {
        int64_t m = n - b < F8_BLOCK ? n - b : F8_BLOCK;
        const float *xb = x + b;
        const float *svb = vec ? sv + b : NULL;
        uint8_t *qb = q + b;
        uint32_t amax = 0;
        int32_t odd = 0, zeros = 0;
        for (int64_t i = 0; i < m; i++) {
            uint32_t ab = lpx_f32_bits(xb[i]) & 0x7FFFFFFFu;
            uint32_t u = lpx_f32_bits(xb[i] * (vec ? svb[i] : s));
            uint32_t a = u & 0x7FFFFFFFu;
            uint32_t ac = a < F8_LO ? F8_LO : a > F8_HI ? F8_HI : a;
            uint32_t yc = ac | (u & 0x80000000u);
            if (e5m2) F8_ASSUME((yc & 0x7FFFFFFFu) >= E5_LO && (yc & 0x7FFFFFFFu) <= E5_HI);
            else F8_ASSUME((yc & 0x7FFFFFFFu) >= E4_LO && (yc & 0x7FFFFFFFu) <= E4_HI);
            uint8_t f = f8_enc(lpx_f32_from_bits(yc), e5m2, 1);
            qb[i] = a == 0 ? ((u >> 31) ? zneg : zpos) : f;
            amax = ab > amax ? ab : amax;
            odd += (ab != 0) & (ac != a);
            zeros += ab == 0;
        }
        int64_t nan = 0, un = 0, sa = 0;
        if (odd)
            for (int64_t i = 0; i < m; i++) {
                uint32_t ab = lpx_f32_bits(xb[i]) & 0x7FFFFFFFu;
                float y = xb[i] * (vec ? svb[i] : s);
                uint32_t a = lpx_f32_bits(y) & 0x7FFFFFFFu;
                if (ab == 0 || (a >= F8_LO && a <= F8_HI)) continue;
                qb[i] = f8_enc(y, e5m2, sat);
                nan += ab > 0x7F800000u;
                un += ab <= 0x7F800000u && a <= zero;
                sa += a >= over && a <= 0x7F800000u;
            }
        if (amax > c->amax_bits) c->amax_bits = amax;
        c->nonzero += m - zeros - nan;
        c->nan += nan;
        c->underflow += un;
        c->saturated += sa;
    }
#undef F8_LO
#undef F8_HI
}

/* Max of |x| as f32 bits (NaN sorts above inf). */
F8_INLINE uint32_t f8_amax_body(const float *restrict x, int64_t n)
{
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t ab = lpx_f32_bits(x[i]) & 0x7FFFFFFFu;
        m = ab > m ? ab : m;
    }
    return m;
}

/* colmax[j] = max(colmax[j], |x[j]| bits), j < n. */
F8_INLINE void f8_colmax_body(const float *restrict x, int64_t n, uint32_t *restrict colmax)
{
    for (int64_t j = 0; j < n; j++) {
        uint32_t ab = lpx_f32_bits(x[j]) & 0x7FFFFFFFu;
        colmax[j] = ab > colmax[j] ? ab : colmax[j];
    }
}

/* bf16 -> f32 (exact: a shift, lpx_bf16_to_f32) and the amax of bf16 data
 * straight from its bits (|bf16| bits order like the values, NaN above
 * inf), returned as f32 bits. */
F8_INLINE void f8_bf16_to_f32_body(const uint16_t *restrict x, float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = lpx_bf16_to_f32(x[i]);
}

F8_INLINE uint32_t f8_amax_bf16_body(const uint16_t *restrict x, int64_t n)
{
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t ab = x[i] & 0x7FFFu;
        m = ab > m ? ab : m;
    }
    return m << 16;
}

/* One encoder: sv == NULL for a scalar scale. */
typedef void (*f8_encode_fn)(const float *x, int64_t n, float s, const float *sv, uint8_t *q, int sat, uint32_t over,
                             uint32_t zero, f8_counts *c);
typedef uint32_t (*f8_amax_fn)(const float *x, int64_t n);
typedef void (*f8_colmax_fn)(const float *x, int64_t n, uint32_t *colmax);
typedef void (*f8_bf16_fn)(const uint16_t *x, float *y, int64_t n);
typedef uint32_t (*f8_amax_bf16_fn)(const uint16_t *x, int64_t n);

typedef struct f8_isa {
    const char *name;
    f8_encode_fn encode[2][2];   /* [e5m2][per-element scales] */
    f8_amax_fn amax;
    f8_colmax_fn colmax;
    f8_bf16_fn bf16_to_f32;
    f8_amax_bf16_fn amax_bf16;
} f8_isa;

#define F8_DEFINE_ENC(NAME, E5, VEC, ATTR)                                                                 \
    ATTR static void NAME(const float *x, int64_t n, float s, const float *sv, uint8_t *q, int sat, uint32_t o, \
                          uint32_t z, f8_counts *c)                                                        \
    {                                                                                                      \
        f8_encode_body(x, n, s, sv, q, E5, VEC, sat, o, z, c);                                             \
    }

#define F8_DEFINE_ISA(SUFFIX, ATTR)                                                                        \
    F8_DEFINE_ENC(enc_e4_##SUFFIX, 0, 0, ATTR)                                                             \
    F8_DEFINE_ENC(enc_e4v_##SUFFIX, 0, 1, ATTR)                                                            \
    F8_DEFINE_ENC(enc_e5_##SUFFIX, 1, 0, ATTR)                                                             \
    F8_DEFINE_ENC(enc_e5v_##SUFFIX, 1, 1, ATTR)                                                            \
    ATTR static uint32_t amax_##SUFFIX(const float *x, int64_t n) { return f8_amax_body(x, n); }           \
    ATTR static void colmax_##SUFFIX(const float *x, int64_t n, uint32_t *cm) { f8_colmax_body(x, n, cm); } \
    ATTR static void bf16_##SUFFIX(const uint16_t *x, float *y, int64_t n) { f8_bf16_to_f32_body(x, y, n); } \
    ATTR static uint32_t amax_bf16_##SUFFIX(const uint16_t *x, int64_t n) { return f8_amax_bf16_body(x, n); } \
    static const f8_isa isa_##SUFFIX = {#SUFFIX,                                                           \
                                        {{enc_e4_##SUFFIX, enc_e4v_##SUFFIX}, {enc_e5_##SUFFIX, enc_e5v_##SUFFIX}}, \
                                        amax_##SUFFIX, colmax_##SUFFIX, bf16_##SUFFIX, amax_bf16_##SUFFIX};

F8_DEFINE_ISA(base, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define F8_HAVE_AVX2 1
F8_DEFINE_ISA(avx2, __attribute__((target("avx2"))))
#endif

static const f8_isa *isa = &isa_base;

/* ---- shared helpers ------------------------------------------------ */





/* The dynamic scale formula (docs/NUMERICS.md): fp8_max / max(amax, 1e-12) in
 * double, clamped to scale_max (> 0), rounded down to a power of two. */
static void dynamic_scale(double amax, double fp8_max, bool pow2, double scale_max, float *scale, float *scale_inv)
{
    double s = fp8_max / (amax > 1e-12 ? amax : 1e-12);
    if (scale_max > 0 && s > scale_max) s = scale_max;
    if (pow2) {
        int e;
        (void)frexp(s, &e);           /* s = f * 2^e, f in [0.5, 1): floor(log2 s) = e - 1 */
        s = ldexp(1.0, e - 1);
    }
    *scale = (float)s;
    *scale_inv = (float)(1.0 / (double)*scale);
}

/* Elements per conversion chunk of a non-f32 (or strided) source: 16 KiB
 * of f32, in L1 beside its fp8 output. */
#define Q_CHUNK 4096

/* Logical elements [start, start + n) of x as f32: a pointer into x when
 * it is contiguous f32, else converted into buf (n <= Q_CHUNK). */
static const float *src_f32(const cpu_view *v, int64_t start, int64_t n, float *buf)
{
    const float *p = cpu_view_f32(v);
    if (p) return p + start;
    if (v->contiguous && v->dtype == LPX_BF16) {
        isa->bf16_to_f32((const uint16_t *)v->base + start, buf, n);
        return buf;
    }
    cpu_load_f32(v, start, n, buf);
    return buf;
}

/* max |x| over logical elements [start, start + n) as f32 bits. */
static uint32_t src_amax(const cpu_view *v, int64_t start, int64_t n, float *buf)
{
    if (v->contiguous && v->dtype == LPX_BF16) return isa->amax_bf16((const uint16_t *)v->base + start, n);
    return isa->amax(src_f32(v, start, n, buf), n);
}

/* ---- fp8_quantize -------------------------------------------------- */

typedef struct quant_job {
    cpu_view x;
    uint8_t *q;
    int64_t outer, D, inner;   /* x seen as [outer, D, inner]; scale [outer, inner] */
    float *scale, *scale_inv;  /* outer * inner values */
    bool dynamic, pow2;
    double scale_max;
    f8_encode_fn enc, enc_vec;
    int sat;
    const f8_format *fmt;
    f8_counts counts;
    float *buf;                /* Q_CHUNK floats */
} quant_job;

static lpx_status nonfinite_amax(const lpx_call *c, uint32_t bits, int64_t group, int64_t ngroups)
{
    float a = lpx_f32_from_bits(bits);
    if (ngroups == 1)
        return lpx_error(LPX_ENUMERIC,
                         "%s: x holds %s (amax = %g); dynamic scaling needs a finite amax (use a static scale to "
                         "encode non-finite values)", cpu_op_name(c), bits > 0x7F800000u ? "NaN" : "+-inf", a);
    return lpx_error(LPX_ENUMERIC,
                     "%s: scale group %lld of %lld holds %s (amax = %g); dynamic scaling needs a finite amax (use a "
                     "static scale to encode non-finite values)",
                     cpu_op_name(c), (long long)group, (long long)ngroups, bits > 0x7F800000u ? "NaN" : "+-inf", a);
}

/* Groups that are contiguous runs (inner == 1): outer groups of D. */
static lpx_status quant_runs(const lpx_call *c, quant_job *j)
{
    for (int64_t g = 0; g < j->outer; g++) {
        int64_t base = g * j->D;
        if (j->dynamic) {
            uint32_t am = 0;
            for (int64_t p = 0; p < j->D; p += Q_CHUNK) {
                int64_t n = j->D - p < Q_CHUNK ? j->D - p : Q_CHUNK;
                uint32_t m = src_amax(&j->x, base + p, n, j->buf);
                am = m > am ? m : am;
            }
            if (am >= 0x7F800000u) return nonfinite_amax(c, am, g, j->outer);
            dynamic_scale(lpx_f32_from_bits(am), j->fmt->max, j->pow2, j->scale_max, &j->scale[g], &j->scale_inv[g]);
        }
        float s = j->scale[g];
        if (cpu_view_f32(&j->x)) {
            j->enc(cpu_view_f32(&j->x) + base, j->D, s, NULL, j->q + base, j->sat, j->fmt->over_bits,
                   j->fmt->zero_bits, &j->counts);
            continue;
        }
        for (int64_t p = 0; p < j->D; p += Q_CHUNK) {
            int64_t n = j->D - p < Q_CHUNK ? j->D - p : Q_CHUNK;
            j->enc(src_f32(&j->x, base + p, n, j->buf), n, s, NULL, j->q + base + p, j->sat, j->fmt->over_bits,
                   j->fmt->zero_bits, &j->counts);
        }
    }
    return LPX_OK;
}

/* Groups that are columns (inner > 1): per outer block, the column amaxes
 * over D rows, then each row encoded with the per-column scales. */
static lpx_status quant_columns(const lpx_call *c, quant_job *j, uint32_t *colmax)
{
    int64_t inner = j->inner;
    for (int64_t o = 0; o < j->outer; o++) {
        int64_t base = o * j->D * inner;
        float *sc = j->scale + o * inner, *si = j->scale_inv + o * inner;
        if (j->dynamic) {
            memset(colmax, 0, (size_t)inner * sizeof *colmax);
            for (int64_t r = 0; r < j->D; r++)
                for (int64_t p = 0; p < inner; p += Q_CHUNK) {
                    int64_t n = inner - p < Q_CHUNK ? inner - p : Q_CHUNK;
                    isa->colmax(src_f32(&j->x, base + r * inner + p, n, j->buf), n, colmax + p);
                }
            for (int64_t k = 0; k < inner; k++) {
                if (colmax[k] >= 0x7F800000u) return nonfinite_amax(c, colmax[k], o * inner + k, j->outer * inner);
                dynamic_scale(lpx_f32_from_bits(colmax[k]), j->fmt->max, j->pow2, j->scale_max, &sc[k], &si[k]);
            }
        }
        for (int64_t r = 0; r < j->D; r++)
            for (int64_t p = 0; p < inner; p += Q_CHUNK) {
                int64_t n = inner - p < Q_CHUNK ? inner - p : Q_CHUNK;
                int64_t at = base + r * inner + p;
                j->enc_vec(src_f32(&j->x, at, n, j->buf), n, 0.0f, sc + p, j->q + at, j->sat, j->fmt->over_bits,
                           j->fmt->zero_bits, &j->counts);
            }
    }
    return LPX_OK;
}

/* Reads a static scale into j->scale (and its reciprocals), checking that
 * every value is finite and > 0: a check that reads data, so the kernel's
 * (the spec checked the scale's dtype and shape). */
static lpx_status read_static_scale(const lpx_call *c, quant_job *j, const lpx_tensor *st)
{
    int64_t ns = j->outer * j->inner;
    cpu_view v;
    cpu_view_of(&v, st);
    for (int64_t p = 0; p < ns; p += CPU_CHUNK) {
        int64_t n = ns - p < CPU_CHUNK ? ns - p : CPU_CHUNK;
        cpu_load_f32(&v, p, n, j->scale + p);
    }
    for (int64_t i = 0; i < ns; i++) {
        float s = j->scale[i];
        if (!(s > 0.0f) || !isfinite(s))
            return lpx_error(LPX_EINVAL, "%s: static scale[%lld] = %g; a scale must be finite and > 0", cpu_op_name(c),
                             (long long)i, (double)s);
        j->scale_inv[i] = (float)(1.0 / (double)s);
    }
    return LPX_OK;
}

static lpx_status k_fp8_quantize(lpx_call *c)
{
    const lpx_fp8_quantize_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x, *sarg = a->scale;
    lpx_dtype fp8 = a->fp8;
    bool pow2 = a->pow2, sat = a->saturate;
    double scale_max = a->scale_max;
    const lpx_fp8_quant_geom g = a->g;
    lpx_status st;
    quant_job j;
    memset(&j, 0, sizeof j);
    cpu_view_of(&j.x, x);
    j.fmt = format_of(fp8);
    j.enc = isa->encode[fp8 == LPX_F8E5M2][0];
    j.enc_vec = isa->encode[fp8 == LPX_F8E5M2][1];
    j.sat = sat ? 1 : 0;
    j.dynamic = sarg == NULL;
    j.pow2 = pow2;
    j.scale_max = scale_max;
    j.outer = g.outer, j.D = g.D, j.inner = g.inner;
    int sndim = g.scale_ndim;
    const int64_t *sshape = g.scale_shape;
    lpx_tensor *q = NULL, *ts = NULL, *tsi = NULL, *tstats = NULL;
    int64_t four = 4;
    if ((st = cpu_new(c, fp8, x->ndim, x->shape, &q)) || (st = cpu_new(c, LPX_F32, sndim, sshape, &ts)) ||
        (st = cpu_new(c, LPX_F32, sndim, sshape, &tsi)) || (st = cpu_new(c, LPX_F32, 1, &four, &tstats)))
        goto fail;
    j.q = lpx_tensor_data(q);
    j.scale = lpx_tensor_data(ts);
    j.scale_inv = lpx_tensor_data(tsi);
    if (!j.dynamic && (st = read_static_scale(c, &j, sarg))) goto fail;
    uint32_t *colmax = NULL;
    j.buf = lpx_malloc(Q_CHUNK * sizeof(float));
    if (j.inner > 1) colmax = lpx_malloc((size_t)j.inner * sizeof *colmax);
    if (!j.buf || (j.inner > 1 && !colmax)) {
        lpx_free(j.buf);
        lpx_free(colmax);
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate scratch buffers", cpu_op_name(c));
        goto fail;
    }
    if (x->numel > 0) st = j.inner > 1 ? quant_columns(c, &j, colmax) : quant_runs(c, &j);
    else if (j.dynamic)
        for (int64_t i = 0; i < j.outer * j.inner; i++)
            dynamic_scale(0.0, j.fmt->max, pow2, scale_max, &j.scale[i], &j.scale_inv[i]);
    lpx_free(j.buf);
    lpx_free(colmax);
    if (st) goto fail;
    float *stats = lpx_tensor_data(tstats);
    const f8_counts *k = &j.counts;
    stats[0] = lpx_f32_from_bits(k->amax_bits > 0x7F800000u ? 0x7FC00000u : k->amax_bits);
    stats[1] = k->nonzero ? (float)((double)k->underflow / (double)k->nonzero) : 0.0f;
    stats[2] = x->numel ? (float)((double)k->saturated / (double)x->numel) : 0.0f;
    stats[3] = x->numel ? (float)((double)k->nan / (double)x->numel) : 0.0f;
    cpu_ret(c, q);
    cpu_ret(c, ts);
    cpu_ret(c, tsi);
    cpu_ret(c, tstats);
    return LPX_OK;
fail:
    lpx_tensor_release(q);
    lpx_tensor_release(ts);
    lpx_tensor_release(tsi);
    lpx_tensor_release(tstats);
    return st;
}

/* ---- fp8_dequantize ------------------------------------------------ */

static lpx_status k_fp8_dequantize(lpx_call *c)
{
    const lpx_fp8_dequantize_args *a = lpx_op_args_of(c);
    lpx_tensor *q = a->q, *si = a->scale_inv;
    lpx_dtype dt = a->dtype;
    lpx_status st;
    lpx_tensor *y;
    if ((st = cpu_new(c, dt, q->ndim, q->shape, &y))) return st;
    cpu_view vq, vs, vy;
    cpu_view_of(&vq, q);
    if (si->numel == 1) cpu_view_init(&vs, si, 0, NULL);
    else cpu_view_init(&vs, si, q->ndim, q->shape);
    cpu_view_of(&vy, y);
    const float *tab = cpu_f8_decode_table(q->dtype);
    float s1 = 0.0f;
    if (si->numel == 1) cpu_load_f32(&vs, 0, 1, &s1);
    /* a finite code dequantizes to a finite value of dt (lpx_f8_dequant_sat) */
    float omax = cpu_f8_out_max(dt);
    if (vq.contiguous && dt == LPX_F32 && si->numel == 1) {
        const uint8_t *src = (const uint8_t *)vq.base;
        float *dst = lpx_tensor_data(y);
        for (int64_t i = 0; i < q->numel; i++) dst[i] = lpx_f8_dequant_sat(tab[src[i]], s1, tab[src[i]] * s1, omax);
        cpu_ret(c, y);
        return LPX_OK;
    }
    float buf[CPU_CHUNK], sb[CPU_CHUNK];
    for (int64_t p = 0; p < q->numel; p += CPU_CHUNK) {
        int64_t n = q->numel - p < CPU_CHUNK ? q->numel - p : CPU_CHUNK;
        cpu_load_f32(&vq, p, n, buf);
        if (si->numel == 1) {
            for (int64_t i = 0; i < n; i++) buf[i] = lpx_f8_dequant_sat(buf[i], s1, buf[i] * s1, omax);
        } else {
            cpu_load_f32(&vs, p, n, sb);
            for (int64_t i = 0; i < n; i++) buf[i] = lpx_f8_dequant_sat(buf[i], sb[i], buf[i] * sb[i], omax);
        }
        cpu_store_f32(&vy, p, n, buf, 0);
    }
    cpu_ret(c, y);
    return LPX_OK;
}

/* ---- fp8_scale_from_amax ------------------------------------------- */

static lpx_status k_fp8_scale_from_amax(lpx_call *c)
{
    const lpx_fp8_scale_from_amax_args *args = lpx_op_args_of(c);
    lpx_tensor *am = args->amax;
    lpx_dtype fp8 = args->fp8;
    bool pow2 = args->pow2;
    double smax = args->scale_max;
    lpx_status st;
    lpx_tensor *s = NULL, *si = NULL;
    if ((st = cpu_new(c, LPX_F32, am->ndim, am->shape, &s)) || (st = cpu_new(c, LPX_F32, am->ndim, am->shape, &si))) {
        lpx_tensor_release(s);
        return st;
    }
    cpu_view v;
    cpu_view_of(&v, am);
    float *ps = lpx_tensor_data(s), *psi = lpx_tensor_data(si);
    double fmax = format_of(fp8)->max;
    for (int64_t i = 0; i < am->numel; i++) {
        float a;
        cpu_load_f32(&v, i, 1, &a);
        if (!isfinite(a)) {   /* a check that reads data: the kernel's */
            lpx_tensor_release(s);
            lpx_tensor_release(si);
            return lpx_error(LPX_ENUMERIC, "%s: amax[%lld] = %g; the scale formula needs a finite amax",
                             cpu_op_name(c), (long long)i, (double)a);
        }
        dynamic_scale(fabs((double)a), fmax, pow2, smax, &ps[i], &psi[i]);
    }
    cpu_ret(c, s);
    cpu_ret(c, si);
    return LPX_OK;
}

lpx_status lpx_cpu_register_float8(void)
{
    lpx_status st;
    if ((st = format_init(&fmt_e4m3, LPX_F8E4M3FN)) || (st = format_init(&fmt_e5m2, LPX_F8E5M2))) return st;
#ifdef F8_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) isa = &isa_avx2;
#endif
    if ((st = cpu_reg(LPX_OP_fp8_quantize, k_fp8_quantize))) return st;
    if ((st = cpu_reg(LPX_OP_fp8_dequantize, k_fp8_dequantize))) return st;
    if ((st = lpx_cpu_register_float8_mm()) || (st = lpx_cpu_register_float8_block())) return st;
    return cpu_reg(LPX_OP_fp8_scale_from_amax, k_fp8_scale_from_amax);
}
