/* GPU suite: the float8 and NF4 kernels of lpx-cuda.so (cuda_fp8_*.cu,
 * cuda_nf4.cu) against the CPU backend on the same inputs, bit for bit:
 * fp8_quantize (all four results; tensorwise dynamic and static, rowwise,
 * columns, odd layouts, pow2, saturate, both fp8 formats, f32/bf16/f16
 * inputs, sizes 1 .. 2^20 + 3, out-of-range values, zero rows, NaN/inf
 * under static scales), fp8_quantize_t (the fused cast + transpose and
 * its composition) and the fp8 transposed copy, the device scale formula against the CPU's on
 * 2^16 amaxes, fp8_dequantize, fp8_scale_from_amax, nf4_quantize,
 * nf4_dequantize (windows, out tensors, odd block sizes, misaligned
 * payload slices) and qlora_dropout; a chain of dependent kernels queued
 * back to back (programmatic dependent launch on sm_90); plus the documented differences
 * (data-dependent errors become NaN scales on the GPU) and argument
 * errors. Skips (77) without a GPU. */
#include "gpu_util.h"

static const lpx_dtype FP8[2] = {LPX_F8E4M3FN, LPX_F8E5M2};
static const lpx_dtype HP[3] = {LPX_BF16, LPX_F16, LPX_F32};

/* ---- inputs ---------------------------------------------------------- */

/* Special values sprinkled into the inputs. */
enum { SP_NONE = 0, SP_FINITE = 1, SP_NONFINITE = 2 };

/* Normal values times mag; with SP_FINITE exact zeros (every 89th),
 * values far beyond the fp8 range (every 97th: +-3000 * mag) and tiny
 * ones that underflow after scaling (every 101st: 1e-6 * mag); with
 * SP_NONFINITE also +-inf and +-NaN (every 211th). zero_row >= 0: that
 * row (of the last dim, length row_len) is all zeros. */
static double *gen_vals(int64_t n, uint64_t seed, double mag, int specials, int64_t zero_row, int64_t row_len)
{
    rng = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        v[i] = nrand() * mag;
        if (specials >= SP_FINITE) {
            if (i % 89 == 5) v[i] = 0.0;
            if (i % 97 == 7) v[i] = (i & 8 ? -3000.0 : 3000.0) * mag;
            if (i % 101 == 11) v[i] = (i & 4 ? -1e-6 : 1e-6) * mag;
        }
        if (specials >= SP_NONFINITE && i % 211 == 13) {
            int k = (int)((i / 211) % 4);
            v[i] = k == 0 ? INFINITY : k == 1 ? -INFINITY : k == 2 ? NAN : -NAN;
        }
        if (zero_row >= 0 && row_len > 0 && i / row_len == zero_row) v[i] = 0.0;
    }
    return v;
}

static lpx_tensor *gen(lpx_dtype dt, int nd, const int64_t *shape, uint64_t seed, double mag, int specials,
                       int64_t zero_row)
{
    int64_t n = numel_of(nd, shape);
    double *v = gen_vals(n, seed, mag, specials, zero_row, nd ? shape[nd - 1] : 1);
    lpx_tensor *t = mk(dt, nd, shape, v);
    free(v);
    return t;
}

/* Positive random values in [lo, hi) (scales). */
static lpx_tensor *gen_pos(int nd, const int64_t *shape, uint64_t seed, double lo, double hi)
{
    rng = seed * 0x2545F4914F6CDD1Dull + 99;
    int64_t n = numel_of(nd, shape);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * urand();
    lpx_tensor *t = mk(LPX_F32, nd, shape, v);
    free(v);
    return t;
}

/* Tensors made on the CPU and moved up (the suite does not depend on the
 * cuda creation kernels). */
static lpx_status gfull(int nd, const int64_t *shape, double v, lpx_dtype dt, lpx_tensor **out)
{
    lpx_tensor *c = NULL;
    lpx_status st = lpx_full(nd, shape, v, dt, lpx_cpu(), &c);
    *out = NULL;
    if (st) return st;
    *out = gpu_up(c);
    lpx_tensor_release(c);
    return *out ? LPX_OK : LPX_EDEVICE;
}

static lpx_status gzeros(int nd, const int64_t *shape, lpx_dtype dt, lpx_tensor **out)
{
    return gfull(nd, shape, 0.0, dt, out);
}

static void rel4(lpx_tensor **t)
{
    for (int i = 0; i < 4; i++) {
        lpx_tensor_release(t[i]);
        t[i] = NULL;
    }
}

/* ---- fp8_quantize ------------------------------------------------------ */

/* Quantizes xc (CPU) and xg (GPU) with the same arguments (static scale sc
 * / sg, either may be NULL for dynamic scaling) and checks that both
 * succeed and that the four results have the same bits. */
static void quant_same(const char *label, lpx_tensor *xc, lpx_tensor *xg, lpx_tensor *sc, lpx_tensor *sg, lpx_dtype f8,
                       const int64_t *dim, bool pow2, double smax, bool sat)
{
    lpx_tensor *a[4] = {NULL, NULL, NULL, NULL}, *b[4] = {NULL, NULL, NULL, NULL};
    lpx_status s1 = lpx_fp8_quantize(xc, sc, f8, dim, pow2, smax, sat, &a[0], &a[1], &a[2], &a[3]);
    if (s1) printf("  %s: cpu: %s\n", label, lpx_last_error());
    lpx_status s2 = lpx_fp8_quantize(xg, sg, f8, dim, pow2, smax, sat, &b[0], &b[1], &b[2], &b[3]);
    if (s2) printf("  %s: cuda: %s\n", label, lpx_last_error());
    CHECK(s1 == LPX_OK && s2 == LPX_OK);
    if (!s1 && !s2) {
        static const char *names[4] = {"q", "scale", "scale_inv", "stats"};
        for (int i = 0; i < 4; i++) {
            char what[256];
            snprintf(what, sizeof what, "%s %s", label, names[i]);
            CHECKF(gpu_same_bits(what, a[i], b[i]), "%s", what);
        }
    }
    rel4(a);
    rel4(b);
}

static void label_of(char *buf, size_t len, const char *kind, lpx_dtype xdt, const lpx_tensor *x, lpx_dtype f8,
                     bool pow2, double smax, bool sat)
{
    char sh[128];
    snprintf(buf, len, "%s x=%s%s f8=%s pow2=%d smax=%g sat=%d", kind, lpx_dtype_name(xdt),
             lpx_tensor_shape_str(x, sh, sizeof sh), lpx_dtype_name(f8), pow2, smax, sat);
}

/* Tensorwise: dynamic, static with the scale on the GPU and on the CPU. */
static void test_quantize_tensorwise(void)
{
    const int64_t sizes[4] = {1, 7, 4097, ((int64_t)1 << 20) + 3};
    for (int si = 0; si < 4; si++)
        for (int h = 0; h < 3; h++) {
            bool big = sizes[si] > 100000;
            if (big && HP[h] == LPX_F16) continue;
            lpx_tensor *xc = gen(HP[h], 1, &sizes[si], 100 + si * 3 + h, 1.0, SP_FINITE, -1);
            lpx_tensor *xg = gpu_up(xc);
            /* a static scale that sends the +-3000 values past both
             * formats' range; and a non power of two one */
            const double svals[2] = {64.0, 0.37};
            for (int f = 0; f < 2; f++)
                for (int sat = 0; sat < 2; sat++) {
                    for (int pow2 = 0; pow2 < 2; pow2++) {
                        if (big && pow2) continue;
                        char lab[256];
                        label_of(lab, sizeof lab, "tensorwise dynamic", HP[h], xc, FP8[f], pow2, 0, sat);
                        quant_same(lab, xc, xg, NULL, NULL, FP8[f], NULL, pow2, 0.0, sat);
                    }
                    for (int k = 0; k < 2; k++) {
                        if (big && k) continue;
                        lpx_tensor *sc = NULL, *sg = NULL;
                        CHECK_OK(lpx_full(0, NULL, svals[k], LPX_F32, lpx_cpu(), &sc));
                        sg = gpu_up(sc);
                        char lab[256];
                        label_of(lab, sizeof lab, "tensorwise static (gpu scale)", HP[h], xc, FP8[f], 0, 0, sat);
                        quant_same(lab, xc, xg, sc, sg, FP8[f], NULL, false, 0.0, sat);
                        label_of(lab, sizeof lab, "tensorwise static (cpu scale)", HP[h], xc, FP8[f], 0, 0, sat);
                        quant_same(lab, xc, xg, sc, sc, FP8[f], NULL, false, 0.0, sat);
                        lpx_tensor_release(sc);
                        lpx_tensor_release(sg);
                    }
                }
            lpx_tensor_release(xc);
            lpx_tensor_release(xg);
        }
}

/* f16 models clamp dynamic scales (scale_max 65504); all-zero tensors;
 * a scale given as a numel-1 tensor of another dtype and shape. */
static void test_quantize_clamp_and_zeros(void)
{
    int64_t n = 1000;
    for (int f = 0; f < 2; f++)
        for (int pow2 = 0; pow2 < 2; pow2++) {
            /* tiny values: fp8_max / amax exceeds 65504 */
            lpx_tensor *xc = gen(LPX_F16, 1, &n, 7, 1e-4, SP_NONE, -1), *xg = gpu_up(xc);
            char lab[256];
            label_of(lab, sizeof lab, "clamp", LPX_F16, xc, FP8[f], pow2, 65504, 1);
            quant_same(lab, xc, xg, NULL, NULL, FP8[f], NULL, pow2, 65504.0, true);
            lpx_tensor_release(xc);
            lpx_tensor_release(xg);
            lpx_tensor *zc = NULL, *zg = NULL;
            CHECK_OK(lpx_zeros(1, &n, LPX_BF16, lpx_cpu(), &zc));
            zg = gpu_up(zc);
            label_of(lab, sizeof lab, "zeros", LPX_BF16, zc, FP8[f], pow2, 0, 1);
            quant_same(lab, zc, zg, NULL, NULL, FP8[f], NULL, pow2, 0.0, true);
            lpx_tensor_release(zc);
            lpx_tensor_release(zg);
        }
    /* empty x */
    int64_t zero = 0;
    lpx_tensor *ec = NULL, *eg = NULL;
    CHECK_OK(lpx_zeros(1, &zero, LPX_BF16, lpx_cpu(), &ec));
    eg = gpu_up(ec);
    quant_same("empty dynamic", ec, eg, NULL, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true);
    int64_t d0 = 0;
    quant_same("empty rowwise", ec, eg, NULL, NULL, LPX_F8E4M3FN, &d0, false, 0.0, true);
    lpx_tensor_release(ec);
    lpx_tensor_release(eg);
    /* a bf16 [1, 1] scale for a tensorwise cast */
    int64_t one[2] = {1, 1};
    double sv = 3.5;
    lpx_tensor *sc = mk(LPX_BF16, 2, one, &sv), *sg = gpu_up(sc);
    lpx_tensor *xc = gen(LPX_BF16, 1, &n, 8, 10.0, SP_FINITE, -1), *xg = gpu_up(xc);
    quant_same("bf16 [1, 1] static scale", xc, xg, sc, sg, LPX_F8E4M3FN, NULL, false, 0.0, false);
    lpx_tensor_release(sc);
    lpx_tensor_release(sg);
    lpx_tensor_release(xc);
    lpx_tensor_release(xg);
}

/* Static scaling encodes inf and NaN (and keeps NaN signs). */
static void test_quantize_nonfinite_static(void)
{
    /* rowwise, [7, 300] with a static [7, 1] scale */
    int64_t shape[2] = {7, 300}, sshape[2] = {7, 1}, dim = 1;
    for (int h = 0; h < 3; h++) {
        lpx_tensor *xc = gen(HP[h], 2, shape, 310 + h, 2.0, SP_NONFINITE, 3), *xg = gpu_up(xc);
        lpx_tensor *sc = gen_pos(2, sshape, 11, 0.5, 90.0), *sg = gpu_up(sc);
        for (int f = 0; f < 2; f++)
            for (int sat = 0; sat < 2; sat++) {
                char lab[256];
                label_of(lab, sizeof lab, "nonfinite rowwise static", HP[h], xc, FP8[f], 0, 0, sat);
                quant_same(lab, xc, xg, sc, sg, FP8[f], &dim, false, 0.0, sat);
            }
        lpx_tensor_release(sc);
        lpx_tensor_release(sg);
        lpx_tensor_release(xc);
        lpx_tensor_release(xg);
    }
    const int64_t sizes[3] = {7, 4097, 70001};
    for (int si = 0; si < 3; si++)
        for (int h = 0; h < 3; h++) {
            lpx_tensor *xc = gen(HP[h], 1, &sizes[si], 300 + si, 2.0, SP_NONFINITE, -1), *xg = gpu_up(xc);
            lpx_tensor *sc = NULL, *sg = NULL;
            CHECK_OK(lpx_full(0, NULL, 8.0, LPX_F32, lpx_cpu(), &sc));
            sg = gpu_up(sc);
            for (int f = 0; f < 2; f++)
                for (int sat = 0; sat < 2; sat++) {
                    char lab[256];
                    label_of(lab, sizeof lab, "nonfinite static", HP[h], xc, FP8[f], 0, 0, sat);
                    quant_same(lab, xc, xg, sc, sg, FP8[f], NULL, false, 0.0, sat);
                }
            lpx_tensor_release(sc);
            lpx_tensor_release(sg);
            lpx_tensor_release(xc);
            lpx_tensor_release(xg);
        }
}

/* Rowwise (and other axes): the team sizes, register-cached and re-read
 * rows, scalar heads and tails, zero rows, static [R, 1] scales on either
 * device. */
static void test_quantize_rowwise(void)
{
    const int64_t Ds[] = {1, 7, 8, 100, 256, 257, 1000, 2048, 4100, 8192, 9000, 12345, 16384, 16392, 20000};
    const int64_t Rs[2] = {3, 33};
    for (size_t di = 0; di < sizeof Ds / sizeof *Ds; di++)
        for (int ri = 0; ri < 2; ri++)
            for (int h = 0; h < 3; h++) {
                int64_t R = Rs[ri], D = Ds[di];
                if (R * D > 400000 && h == 1) continue;
                int64_t shape[2] = {R, D};
                lpx_tensor *xc = gen(HP[h], 2, shape, 1000 + di * 7 + ri * 3 + h, 4.0, SP_FINITE, 1);
                lpx_tensor *xg = gpu_up(xc);
                int64_t sshape[2] = {R, 1};
                lpx_tensor *sc = gen_pos(2, sshape, 77 + di, 0.05, 80.0), *sg = gpu_up(sc);
                for (int f = 0; f < 2; f++)
                    for (int variant = 0; variant < 4; variant++) {
                        bool pow2 = variant & 1, sat = (variant & 2) != 0;
                        int64_t dim = variant == 3 ? 1 : -1;
                        char lab[256];
                        label_of(lab, sizeof lab, "rowwise dynamic", HP[h], xc, FP8[f], pow2, 0, sat);
                        quant_same(lab, xc, xg, NULL, NULL, FP8[f], &dim, pow2, 0.0, sat);
                        if (variant == 1) {
                            label_of(lab, sizeof lab, "rowwise dynamic clamp", HP[h], xc, FP8[f], pow2, 65504, sat);
                            quant_same(lab, xc, xg, NULL, NULL, FP8[f], &dim, pow2, 65504.0, sat);
                        }
                        if (variant < 2) {
                            label_of(lab, sizeof lab, "rowwise static (gpu scale)", HP[h], xc, FP8[f], 0, 0, sat);
                            quant_same(lab, xc, xg, sc, sg, FP8[f], &dim, false, 0.0, sat);
                        } else if (variant == 2) {
                            label_of(lab, sizeof lab, "rowwise static (cpu scale)", HP[h], xc, FP8[f], 0, 0, sat);
                            quant_same(lab, xc, xg, sc, sc, FP8[f], &dim, false, 0.0, sat);
                        }
                    }
                lpx_tensor_release(sc);
                lpx_tensor_release(sg);
                lpx_tensor_release(xc);
                lpx_tensor_release(xg);
            }
}

/* Rows of 8K-16K elements (k_rows_regs) in more rows than the persistent
 * grid has blocks (2 per SM), so each block walks several rows and the
 * bf16/f16 kernels prefetch the next row while casting the current one;
 * a slice at an odd element offset gives every row a scalar head and tail.
 * Dynamic, static, pow2; specials and a zero row. */
static void test_quantize_rowwise_many_rows(void)
{
    const int64_t Ds[3] = {8200, 12345, 16384};
    for (int di = 0; di < 3; di++)
        for (int h = 0; h < 2; h++) {
            int64_t R = 613 + di, D = Ds[di], shape[2] = {R, D}, dim = 1;
            lpx_tensor *xc = gen(HP[h], 2, shape, 4000 + (uint64_t)di * 2 + (uint64_t)h, 4.0, SP_FINITE, 5);
            lpx_tensor *xg = gpu_up(xc);
            int64_t sshape[2] = {R, 1};
            lpx_tensor *sc = gen_pos(2, sshape, 91 + (uint64_t)di, 0.05, 80.0), *sg = gpu_up(sc);
            char lab[256];
            label_of(lab, sizeof lab, "many rows dynamic", HP[h], xc, FP8[di % 2], false, 0, true);
            quant_same(lab, xc, xg, NULL, NULL, FP8[di % 2], &dim, false, 0.0, true);
            label_of(lab, sizeof lab, "many rows dynamic pow2", HP[h], xc, FP8[1 - di % 2], true, 0, false);
            quant_same(lab, xc, xg, NULL, NULL, FP8[1 - di % 2], &dim, true, 0.0, false);
            label_of(lab, sizeof lab, "many rows static", HP[h], xc, FP8[0], false, 0, true);
            quant_same(lab, xc, xg, sc, sg, FP8[0], &dim, false, 0.0, true);
            /* rows D - 2 long starting one element in: misaligned heads */
            lpx_tensor *vc = NULL, *vg = NULL;
            CHECK_OK(lpx_narrow(xc, 1, 1, D - 2, &vc));
            CHECK_OK(lpx_narrow(xg, 1, 1, D - 2, &vg));
            label_of(lab, sizeof lab, "many rows misaligned", HP[h], vc, FP8[0], false, 0, true);
            quant_same(lab, vc, vg, NULL, NULL, FP8[0], &dim, false, 0.0, true);
            lpx_tensor *rel[6] = {xc, xg, sc, sg, vc, vg};
            for (int i = 0; i < 6; i++) lpx_tensor_release(rel[i]);
        }
}

/* Columns (dim 0), a middle dim, misaligned and transposed views. */
static void test_quantize_axes_and_views(void)
{
    for (int h = 0; h < 3; h++) {
        int64_t shape[2] = {37, 70};
        lpx_tensor *xc = gen(HP[h], 2, shape, 500 + h, 3.0, SP_FINITE, 2), *xg = gpu_up(xc);
        int64_t d0 = 0;
        int64_t cshape[2] = {1, 70};
        lpx_tensor *sc = gen_pos(2, cshape, 5, 0.5, 40.0), *sg = gpu_up(sc);
        for (int f = 0; f < 2; f++) {
            quant_same("columns dynamic", xc, xg, NULL, NULL, FP8[f], &d0, true, 0.0, true);
            quant_same("columns dynamic nonsat", xc, xg, NULL, NULL, FP8[f], &d0, false, 0.0, false);
            quant_same("columns static (gpu scale)", xc, xg, sc, sg, FP8[f], &d0, false, 0.0, false);
            quant_same("columns static (cpu scale)", xc, xg, sc, sc, FP8[f], &d0, false, 0.0, true);
        }
        lpx_tensor_release(sc);
        lpx_tensor_release(sg);
        /* transposed view [70, 37]: rowwise over strided rows, tensorwise
         * over a strided tensor */
        int64_t tshape[2] = {70, 37}, tstr[2] = {1, 70};
        lpx_tensor *tc = view(xc, 2, tshape, tstr, 0), *tg = view(xg, 2, tshape, tstr, 0);
        int64_t dl = -1;
        for (int f = 0; f < 2; f++) {
            quant_same("transposed rowwise", tc, tg, NULL, NULL, FP8[f], &dl, false, 0.0, true);
            quant_same("transposed tensorwise", tc, tg, NULL, NULL, FP8[f], NULL, false, 0.0, true);
            quant_same("transposed columns", tc, tg, NULL, NULL, FP8[f], &d0, true, 0.0, false);
        }
        lpx_tensor_release(tc);
        lpx_tensor_release(tg);
        lpx_tensor_release(xc);
        lpx_tensor_release(xg);
        /* 3-d, middle dim */
        int64_t s3[3] = {4, 5, 66};
        xc = gen(HP[h], 3, s3, 600 + h, 1.0, SP_FINITE, -1), xg = gpu_up(xc);
        int64_t d1 = 1;
        for (int f = 0; f < 2; f++) quant_same("3-d dim 1", xc, xg, NULL, NULL, FP8[f], &d1, false, 0.0, true);
        lpx_tensor_release(xc);
        lpx_tensor_release(xg);
        /* misaligned: a view one element into a larger buffer */
        int64_t n = 3 * 4100 + 1;
        lpx_tensor *bc = gen(HP[h], 1, &n, 700 + h, 1.0, SP_FINITE, -1), *bg = gpu_up(bc);
        int64_t mshape[2] = {3, 4100}, mstr[2] = {4100, 1};
        lpx_tensor *mc = view(bc, 2, mshape, mstr, 1), *mg = view(bg, 2, mshape, mstr, 1);
        for (int f = 0; f < 2; f++) {
            quant_same("misaligned rowwise", mc, mg, NULL, NULL, FP8[f], &dl, false, 0.0, true);
            quant_same("misaligned tensorwise", mc, mg, NULL, NULL, FP8[f], NULL, false, 0.0, true);
        }
        lpx_tensor_release(mc);
        lpx_tensor_release(mg);
        lpx_tensor_release(bc);
        lpx_tensor_release(bg);
    }
    /* columns of 8-aligned widths (the tiled column kernels): a partial
     * tile of vectors, several row chunks, a middle dim, static scales on
     * either device, zero columns */
    const int64_t cshapes[3][3] = {{1, 37, 72}, {1, 300, 4104}, {3, 600, 16}};
    for (int k = 0; k < 3; k++)
        for (int h = 0; h < 3; h++) {
            const int64_t *sh = cshapes[k];
            lpx_tensor *xc = gen(HP[h], 3, sh, 650 + k * 3 + h, 2.0, SP_FINITE, 0), *xg = gpu_up(xc);
            int64_t d1 = 1, ssh[3] = {sh[0], 1, sh[2]};
            lpx_tensor *sc = gen_pos(3, ssh, 21 + k, 0.1, 60.0), *sg = gpu_up(sc);
            for (int f = 0; f < 2; f++)
                for (int sat = 0; sat < 2; sat++) {
                    char lab[256];
                    label_of(lab, sizeof lab, "tiled columns dynamic", HP[h], xc, FP8[f], sat, 0, sat);
                    quant_same(lab, xc, xg, NULL, NULL, FP8[f], &d1, sat != 0, 0.0, sat);
                    label_of(lab, sizeof lab, "tiled columns static (gpu scale)", HP[h], xc, FP8[f], 0, 0, sat);
                    quant_same(lab, xc, xg, sc, sg, FP8[f], &d1, false, 0.0, sat);
                    label_of(lab, sizeof lab, "tiled columns static (cpu scale)", HP[h], xc, FP8[f], 0, 0, sat);
                    quant_same(lab, xc, xg, sc, sc, FP8[f], &d1, false, 0.0, sat);
                }
            lpx_tensor_release(sc);
            lpx_tensor_release(sg);
            lpx_tensor_release(xc);
            lpx_tensor_release(xg);
        }
    /* an fp8 input (any float dtype is accepted) */
    int64_t n = 999;
    lpx_tensor *xc = gen(LPX_F8E5M2, 1, &n, 801, 10.0, SP_NONE, -1), *xg = gpu_up(xc);
    quant_same("fp8 input", xc, xg, NULL, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true);
    lpx_tensor_release(xc);
    lpx_tensor_release(xg);
}

/* The kernels' f32 scale formula against the CPU's double one: one amax
 * per row of an [R, 1] tensor (random bit patterns over the whole f32
 * range, and values around 1e-12, powers of two and fp8_max * 2^k). */
static void test_scale_formula(void)
{
    const int64_t R = 65536;
    float *v = malloc((size_t)R * sizeof *v);
    rng = 4242;
    for (int64_t i = 0; i < R; i++) {
        uint32_t u;
        int k = (int)(i % 8);
        if (k < 4) {
            u = (uint32_t)(urand() * 2139095040.0); /* [0, inf) bits */
        } else if (k == 4) {
            u = 0x2B8CBCCCu + (uint32_t)((int)(urand() * 64) - 32); /* around 1e-12 */
        } else if (k == 5) {
            u = ((uint32_t)(urand() * 200 + 20) << 23) + (uint32_t)((int)(urand() * 5) - 2); /* around 2^k */
        } else {
            float base = (k == 6 ? 448.0f : 57344.0f) * ldexpf(1.0f, (int)(urand() * 100) - 60);
            memcpy(&u, &base, 4);
            u += (uint32_t)((int)(urand() * 7) - 3);
        }
        u &= 0x7FFFFFFFu;
        if (u >= 0x7F800000u) u = 0x7F7FFFFFu;
        memcpy(&v[i], &u, 4);
    }
    int64_t shape[2] = {R, 1};
    lpx_tensor *xc = NULL;
    CHECK_OK(lpx_tensor_new(LPX_F32, 2, shape, lpx_cpu(), &xc));
    memcpy(lpx_tensor_data(xc), v, (size_t)R * sizeof *v);
    free(v);
    lpx_tensor *xg = gpu_up(xc);
    int64_t dim = -1;
    const double smaxes[4] = {0.0, 65504.0, 3.0, 1e20};
    for (int f = 0; f < 2; f++)
        for (int pow2 = 0; pow2 < 2; pow2++)
            for (int k = 0; k < 4; k++) {
                char lab[128];
                snprintf(lab, sizeof lab, "scale formula f8=%s pow2=%d smax=%g", lpx_dtype_name(FP8[f]), pow2,
                         smaxes[k]);
                quant_same(lab, xc, xg, NULL, NULL, FP8[f], &dim, pow2, smaxes[k], true);
            }
    /* the same amaxes through fp8_scale_from_amax (the double formula on
     * the GPU) */
    for (int f = 0; f < 2; f++)
        for (int pow2 = 0; pow2 < 2; pow2++) {
            lpx_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
            CHECK_OK(lpx_fp8_scale_from_amax(xc, FP8[f], pow2, 65504.0, &a, &b));
            CHECK_OK(lpx_fp8_scale_from_amax(xg, FP8[f], pow2, 65504.0, &c, &d));
            CHECK(a && c && gpu_same_bits("scale_from_amax scale", a, c));
            CHECK(b && d && gpu_same_bits("scale_from_amax scale_inv", b, d));
            lpx_tensor_release(a);
            lpx_tensor_release(b);
            lpx_tensor_release(c);
            lpx_tensor_release(d);
        }
    lpx_tensor_release(xc);
    lpx_tensor_release(xg);
}

/* What the GPU does where the CPU fails on the data: a dynamic scale group
 * with NaN or inf gets NaN scale and scale_inv (no host round trip). */
static void test_quantize_nonfinite_dynamic(void)
{
    int64_t shape[2] = {4, 300};
    lpx_tensor *xc = gen(LPX_BF16, 2, shape, 900, 1.0, SP_NONE, -1);
    wr(xc, 2 * 300 + 17, NAN);
    wr(xc, 3 * 300 + 5, -INFINITY);
    lpx_tensor *xg = gpu_up(xc);
    lpx_tensor *r[4] = {NULL, NULL, NULL, NULL};
    CHECK_ERR(lpx_fp8_quantize(xc, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]),
              LPX_ENUMERIC);
    CHECK_OK(lpx_fp8_quantize(xg, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]));
    double v = 0;
    lpx_tensor *s = r[1] ? gpu_down(r[1]) : NULL;
    CHECK(s && !lpx_item(s, 0, &v) && isnan(v));
    lpx_tensor_release(s);
    rel4(r);
    int64_t dim = 1;
    CHECK_ERR(lpx_fp8_quantize(xc, NULL, LPX_F8E4M3FN, &dim, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]),
              LPX_ENUMERIC);
    CHECK_OK(lpx_fp8_quantize(xg, NULL, LPX_F8E4M3FN, &dim, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]));
    s = r[1] ? gpu_down(r[1]) : NULL;
    for (int i = 0; s && i < 4; i++) {
        CHECK(!lpx_item(s, i, &v));
        CHECK(i >= 2 ? isnan(v) : v > 0 && isfinite(v));
    }
    lpx_tensor_release(s);
    rel4(r);
    lpx_tensor_release(xc);
    lpx_tensor_release(xg);
}

/* Argument errors name the op and argument like the CPU's. */
static void test_quantize_errors(void)
{
    int64_t n = 16, two[2] = {4, 4}, three = 3;
    lpx_tensor *xg = NULL, *bad = NULL, *r[4] = {NULL, NULL, NULL, NULL};
    CHECK_OK(gzeros(1, &n, LPX_BF16, &xg));
    CHECK_ERR(lpx_fp8_quantize(xg, NULL, LPX_BF16, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]), LPX_EDTYPE);
    CHECK_ERR(lpx_fp8_quantize(xg, NULL, LPX_F8E4M3FN, NULL, false, -1.0, true, &r[0], &r[1], &r[2], &r[3]),
              LPX_EINVAL);
    int64_t d5 = 5;
    CHECK_ERR(lpx_fp8_quantize(xg, NULL, LPX_F8E4M3FN, &d5, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]), LPX_ERANGE);
    CHECK_OK(gzeros(1, &three, LPX_F32, &bad));
    CHECK_ERR(lpx_fp8_quantize(xg, bad, LPX_F8E4M3FN, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]), LPX_ESHAPE);
    lpx_tensor_release(bad);
    /* a CPU static scale is checked on the host, like the CPU kernel */
    CHECK_OK(lpx_full(0, NULL, -2.0, LPX_F32, lpx_cpu(), &bad));
    CHECK_ERR(lpx_fp8_quantize(xg, bad, LPX_F8E4M3FN, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]), LPX_EINVAL);
    lpx_tensor_release(bad);
    lpx_tensor *xi = NULL;
    CHECK_OK(gzeros(2, two, LPX_I32, &xi));
    CHECK_ERR(lpx_fp8_quantize(xi, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true, &r[0], &r[1], &r[2], &r[3]), LPX_EDTYPE);
    lpx_tensor_release(xi);
    lpx_tensor_release(xg);
}

/* ---- fp8_quantize_t (cast + transpose) ------------------------------------ */

/* fp8_quantize_t on the CPU and the GPU with the same arguments: all seven
 * results bit for bit. */
static void quant_t_same(const char *label, lpx_tensor *xc, lpx_tensor *xg, lpx_tensor *sc, lpx_tensor *sg,
                         lpx_dtype f8, bool axiswise, bool pow2, double smax, bool sat)
{
    lpx_tensor *a[7] = {0}, *b[7] = {0};
    lpx_status s1 = lpx_fp8_quantize_t(xc, sc, f8, axiswise, pow2, smax, sat, &a[0], &a[1], &a[2], &a[3], &a[4],
                                       &a[5], &a[6]);
    if (s1) printf("  %s: cpu: %s\n", label, lpx_last_error());
    lpx_status s2 = lpx_fp8_quantize_t(xg, sg, f8, axiswise, pow2, smax, sat, &b[0], &b[1], &b[2], &b[3], &b[4],
                                       &b[5], &b[6]);
    if (s2) printf("  %s: cuda: %s\n", label, lpx_last_error());
    CHECK(s1 == LPX_OK && s2 == LPX_OK);
    if (!s1 && !s2) {
        static const char *names[7] = {"q", "scale", "scale_inv", "stats", "qt", "scale_t", "scale_inv_t"};
        for (int i = 0; i < 7; i++) {
            char what[256];
            snprintf(what, sizeof what, "%s %s", label, names[i]);
            CHECKF(gpu_same_bits(what, a[i], b[i]), "%s", what);
        }
    }
    for (int i = 0; i < 7; i++) {
        lpx_tensor_release(a[i]);
        lpx_tensor_release(b[i]);
    }
}

/* Shapes the fused kernels serve (R % 16 == 0, C % 8 == 0: partial tiles
 * at both edges included) and shapes that go to the composition; every
 * input dtype, both formats, tensorwise dynamic / static (device and host
 * scale) and axiswise, pow2, saturating or not, with out-of-range, tiny
 * and zero values and a zero row. */
static void test_quantize_t(void)
{
    static const int64_t shapes[][2] = {{256, 512}, {144, 200}, {16, 8}, {1040, 72}, {17, 33}, {24, 12}, {1, 64}};
    int k = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        for (int h = 0; h < 3; h++) {
            k++;
            int64_t shape[2] = {shapes[si][0], shapes[si][1]};
            lpx_tensor *xc = gen(HP[h], 2, shape, 7000 + (uint64_t)k, 3.0, SP_FINITE, shape[0] > 2 ? 1 : -1);
            lpx_tensor *xg = gpu_up(xc);
            lpx_dtype f8 = FP8[k % 2];
            bool sat = k % 3 != 0;
            char label[160];
            snprintf(label, sizeof label, "[%lld, %lld] %s -> %s%s", (long long)shape[0], (long long)shape[1],
                     lpx_dtype_name(HP[h]), lpx_dtype_name(f8), sat ? "" : " nonsat");
            char l2[200];
            snprintf(l2, sizeof l2, "%s tensorwise dynamic", label);
            quant_t_same(l2, xc, xg, NULL, NULL, f8, false, false, 0.0, sat);
            snprintf(l2, sizeof l2, "%s tensorwise dynamic pow2 clamp", label);
            quant_t_same(l2, xc, xg, NULL, NULL, f8, false, true, 16.0, sat);
            snprintf(l2, sizeof l2, "%s axiswise", label);
            quant_t_same(l2, xc, xg, NULL, NULL, f8, true, k % 2 == 0, 0.0, sat);
            lpx_tensor *sc = gen_pos(0, NULL, 100 + (uint64_t)k, 0.5, 40.0), *sg = gpu_up(sc);
            snprintf(l2, sizeof l2, "%s static (device scale)", label);
            quant_t_same(l2, xc, xg, sc, sg, f8, false, false, 0.0, sat);
            snprintf(l2, sizeof l2, "%s static (host scale)", label);
            quant_t_same(l2, xc, xg, sc, sc, f8, false, false, 0.0, sat);
            lpx_tensor *rel[4] = {xc, xg, sc, sg};
            for (int i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
        }
    }
    /* non-finite values under a static scale */
    int64_t shape[2] = {64, 48};
    lpx_tensor *xc = gen(LPX_BF16, 2, shape, 99, 2.0, SP_NONFINITE, -1), *xg = gpu_up(xc);
    lpx_tensor *sc = gen_pos(0, NULL, 5, 1.0, 2.0), *sg = gpu_up(sc);
    quant_t_same("nonfinite static", xc, xg, sc, sg, LPX_F8E4M3FN, false, false, 0.0, true);
    quant_t_same("nonfinite static nonsat e5m2", xc, xg, sc, sg, LPX_F8E5M2, false, false, 0.0, false);
    /* argument errors: one message for both devices (the composition) */
    lpx_tensor *o[7] = {0};
    CHECK_ERR(lpx_fp8_quantize_t(xg, sg, LPX_F8E4M3FN, true, false, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4],
                                 &o[5], &o[6]),
              LPX_EINVAL);
    CHECK_ERR(lpx_fp8_quantize_t(xg, NULL, LPX_BF16, false, false, 0, true, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                 &o[6]),
              LPX_EDTYPE);
    CHECK_ERR(lpx_fp8_quantize_t(xg, NULL, LPX_F8E4M3FN, false, false, -1.0, true, &o[0], &o[1], &o[2], &o[3], &o[4],
                                 &o[5], &o[6]),
              LPX_EINVAL);
    for (int i = 0; i < 7; i++) CHECK(o[i] == NULL);
    lpx_tensor *rel[4] = {xc, xg, sc, sg};
    for (int i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
}

/* The transposed copy of fp8 bytes (copy_ of a transposed contiguous
 * matrix: the tiled transpose of cuda_copy.cu), 1-, 2- and 4-byte
 * elements, edge tiles included, against the CPU. */
static void test_transpose_copy(void)
{
    static const int64_t shapes[][2] = {{4096, 1024}, {65, 130}, {2, 3}, {1000, 64}};
    static const lpx_dtype dts[3] = {LPX_F8E4M3FN, LPX_BF16, LPX_F32};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int d = 0; d < 3; d++) {
            lpx_tensor *x = gen(LPX_F32, 2, shapes[si], 300 + si, 2.0, SP_NONE, -1), *xc = NULL, *xg = NULL;
            lpx_tensor *tc = NULL, *tg = NULL, *cc = NULL, *cg = NULL;
            CHECK_OK(lpx_cast(x, dts[d], true, &xc));
            xg = gpu_up(xc);
            CHECK_OK(lpx_t(xc, &tc));
            CHECK_OK(lpx_t(xg, &tg));
            CHECK_OK(lpx_contiguous(tc, &cc));
            CHECK_OK(lpx_contiguous(tg, &cg));
            char what[96];
            snprintf(what, sizeof what, "transpose [%lld, %lld] %s", (long long)shapes[si][0],
                     (long long)shapes[si][1], lpx_dtype_name(dts[d]));
            CHECKF(gpu_same_bits(what, cc, cg), "%s", what);
            lpx_tensor *rel[7] = {x, xc, xg, tc, tg, cc, cg};
            for (int i = 0; i < 7; i++) lpx_tensor_release(rel[i]);
        }
}

/* ---- fp8_dequantize ------------------------------------------------------ */

/* Random bytes as an fp8 tensor (every code, NaN ones included). */
static lpx_tensor *random_codes(lpx_dtype f8, int nd, const int64_t *shape, uint64_t seed)
{
    lpx_tensor *t = NULL;
    if (lpx_tensor_new(f8, nd, shape, lpx_cpu(), &t)) return NULL;
    rng = seed + 17;
    unsigned char *p = lpx_tensor_data(t);
    for (int64_t i = 0; i < lpx_tensor_numel(t); i++) p[i] = (unsigned char)(urand() * 256.0);
    return t;
}

static void deq_same(const char *label, lpx_tensor *qc, lpx_tensor *qg, lpx_tensor *sc, lpx_tensor *sg, lpx_dtype dt)
{
    lpx_tensor *a = NULL, *b = NULL;
    lpx_status s1 = lpx_fp8_dequantize(qc, sc, dt, &a), s2 = lpx_fp8_dequantize(qg, sg, dt, &b);
    if (s1 || s2) printf("  %s: %s\n", label, lpx_last_error());
    CHECK(!s1 && !s2);
    if (!s1 && !s2) {
        char what[200];
        snprintf(what, sizeof what, "%s -> %s", label, lpx_dtype_name(dt));
        CHECKF(gpu_same_bits(what, a, b), "%s", what);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
}

static void test_dequantize(void)
{
    const lpx_dtype outs[4] = {LPX_F32, LPX_BF16, LPX_F16, LPX_F8E5M2};
    const int64_t shapes[3][2] = {{1, 1}, {33, 129}, {257, 1024}};
    for (int f = 0; f < 2; f++)
        for (int si = 0; si < 3; si++) {
            const int64_t *sh = shapes[si];
            lpx_tensor *qc = random_codes(FP8[f], 2, sh, 10 + si), *qg = gpu_up(qc);
            lpx_tensor *s1c = NULL, *s1g;
            CHECK_OK(lpx_full(0, NULL, 0.0123, LPX_F32, lpx_cpu(), &s1c));
            s1g = gpu_up(s1c);
            int64_t rs[2] = {sh[0], 1}, cs[2] = {1, sh[1]};
            lpx_tensor *src = gen_pos(2, rs, 3, 1e-3, 10.0), *srg = gpu_up(src);
            lpx_tensor *scc = gen_pos(2, cs, 4, 1e-3, 10.0), *scg = gpu_up(scc);
            for (int o = 0; o < 4; o++) {
                deq_same("tensorwise (gpu scale_inv)", qc, qg, s1c, s1g, outs[o]);
                deq_same("tensorwise (cpu scale_inv)", qc, qg, s1c, s1c, outs[o]);
                deq_same("rowwise", qc, qg, src, srg, outs[o]);
                deq_same("columnwise", qc, qg, scc, scg, outs[o]);
            }
            /* transposed q, and q one byte into its buffer (misaligned) */
            int64_t tsh[2] = {sh[1], sh[0]}, tst[2] = {1, sh[1]};
            lpx_tensor *tc = view(qc, 2, tsh, tst, 0), *tg = view(qg, 2, tsh, tst, 0);
            deq_same("transposed", tc, tg, s1c, s1g, LPX_BF16);
            lpx_tensor_release(tc);
            lpx_tensor_release(tg);
            int64_t m = sh[0] * sh[1] - 1, one = 1;
            if (m > 0) {
                lpx_tensor *mc = view(qc, 1, &m, &one, 1), *mg = view(qg, 1, &m, &one, 1);
                deq_same("misaligned", mc, mg, s1c, s1g, LPX_F32);
                deq_same("misaligned", mc, mg, s1c, s1g, LPX_BF16);
                lpx_tensor_release(mc);
                lpx_tensor_release(mg);
            }
            lpx_tensor_release(qc);
            lpx_tensor_release(qg);
            lpx_tensor_release(s1c);
            lpx_tensor_release(s1g);
            lpx_tensor_release(src);
            lpx_tensor_release(srg);
            lpx_tensor_release(scc);
            lpx_tensor_release(scg);
        }
    /* a finite code times a finite scale stays finite (issue 33: e4m3 256 with
     * scale_inv 2^120 is 2^128, inf before the clamp): the GPU clamps as the
     * CPU does, to the output dtype's largest finite value */
    {
        int64_t k = 64;
        lpx_tensor *bc = NULL, *sbig = NULL, *bg, *sbg;
        CHECK_OK(lpx_tensor_new(LPX_F8E4M3FN, 1, &k, lpx_cpu(), &bc));
        if (bc) memset(lpx_tensor_data(bc), 0x78, (size_t)k);   /* +256 */
        CHECK_OK(lpx_full(0, NULL, ldexp(1.0, 120), LPX_F32, lpx_cpu(), &sbig));
        bg = gpu_up(bc);
        sbg = gpu_up(sbig);
        deq_same("finite code, scale_inv 2^120", bc, bg, sbig, sbg, LPX_F32);
        deq_same("finite code, scale_inv 2^120", bc, bg, sbig, sbg, LPX_BF16);
        lpx_tensor *yc = NULL;
        CHECK_OK(lpx_fp8_dequantize(bc, sbig, LPX_F32, &yc));
        double v = 0;
        CHECK(yc && !lpx_item(yc, 0, &v) && isfinite(v));
        lpx_tensor *rel[] = {bc, sbig, bg, sbg, yc};
        for (int i = 0; i < 5; i++) lpx_tensor_release(rel[i]);
    }
    /* errors */
    int64_t n = 8;
    lpx_tensor *xg = NULL, *sg = NULL, *y = NULL;
    CHECK_OK(gzeros(1, &n, LPX_BF16, &xg));
    CHECK_OK(gfull(0, NULL, 1.0, LPX_F32, &sg));
    CHECK_ERR(lpx_fp8_dequantize(xg, sg, LPX_F32, &y), LPX_EDTYPE);
    lpx_tensor_release(xg);
    CHECK_OK(gzeros(1, &n, LPX_F8E4M3FN, &xg));
    CHECK_ERR(lpx_fp8_dequantize(xg, sg, LPX_I32, &y), LPX_EDTYPE);
    lpx_tensor_release(sg);
    int64_t three = 3;
    CHECK_OK(gfull(1, &three, 1.0, LPX_F32, &sg));
    CHECK_ERR(lpx_fp8_dequantize(xg, sg, LPX_F32, &y), LPX_ESHAPE);
    lpx_tensor_release(sg);
    lpx_tensor_release(xg);
}

/* ---- fp8_scale_from_amax ---------------------------------------------- */

static void test_scale_from_amax(void)
{
    int64_t shape[2] = {9, 7};
    double v[63];
    rng = 31;
    for (int i = 0; i < 63; i++) v[i] = i % 9 == 0 ? 0.0 : i % 9 == 1 ? 1e-20 : i % 9 == 2 ? -5.0 : exp(nrand() * 10);
    lpx_tensor *ac = mk(LPX_F32, 2, shape, v), *ag = gpu_up(ac);
    int64_t tsh[2] = {7, 9}, tst[2] = {1, 7};
    lpx_tensor *tc = view(ac, 2, tsh, tst, 0), *tg = view(ag, 2, tsh, tst, 0);
    const double smaxes[3] = {0.0, 65504.0, 1.5};
    for (int f = 0; f < 2; f++)
        for (int pow2 = 0; pow2 < 2; pow2++)
            for (int k = 0; k < 3; k++)
                for (int t = 0; t < 2; t++) {
                    lpx_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
                    CHECK_OK(lpx_fp8_scale_from_amax(t ? tc : ac, FP8[f], pow2, smaxes[k], &a, &b));
                    CHECK_OK(lpx_fp8_scale_from_amax(t ? tg : ag, FP8[f], pow2, smaxes[k], &c, &d));
                    CHECK(a && c && gpu_same_bits("scale", a, c));
                    CHECK(b && d && gpu_same_bits("scale_inv", b, d));
                    lpx_tensor_release(a);
                    lpx_tensor_release(b);
                    lpx_tensor_release(c);
                    lpx_tensor_release(d);
                }
    lpx_tensor_release(tc);
    lpx_tensor_release(tg);
    /* bf16 amaxes */
    lpx_tensor *bc = NULL, *bg = NULL, *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK_OK(lpx_cast(ac, LPX_BF16, false, &bc));
    bg = gpu_up(bc);
    CHECK_OK(lpx_fp8_scale_from_amax(bc, LPX_F8E5M2, true, 0.0, &a, &b));
    CHECK_OK(lpx_fp8_scale_from_amax(bg, LPX_F8E5M2, true, 0.0, &c, &d));
    CHECK(a && c && gpu_same_bits("bf16 amax scale", a, c));
    CHECK(b && d && gpu_same_bits("bf16 amax scale_inv", b, d));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
    lpx_tensor_release(d);
    lpx_tensor_release(bc);
    lpx_tensor_release(bg);
    /* a non-finite amax: CPU error, GPU NaN */
    wr(ac, 4, INFINITY);
    lpx_tensor_release(ag);
    ag = gpu_up(ac);
    CHECK_ERR(lpx_fp8_scale_from_amax(ac, LPX_F8E4M3FN, false, 0.0, &a, &b), LPX_ENUMERIC);
    CHECK_OK(lpx_fp8_scale_from_amax(ag, LPX_F8E4M3FN, false, 0.0, &c, &d));
    lpx_tensor *cc = c ? gpu_down(c) : NULL;
    double x = 0;
    CHECK(cc && !lpx_item(cc, 4, &x) && isnan(x));
    CHECK(cc && !lpx_item(cc, 5, &x) && isfinite(x));
    lpx_tensor_release(cc);
    lpx_tensor_release(c);
    lpx_tensor_release(d);
    CHECK_ERR(lpx_fp8_scale_from_amax(ag, LPX_F8E4M3FN, false, -1.0, &c, &d), LPX_EINVAL);
    CHECK_ERR(lpx_fp8_scale_from_amax(ag, LPX_F32, false, 0.0, &c, &d), LPX_EDTYPE);
    lpx_tensor_release(ac);
    lpx_tensor_release(ag);
}

/* ---- NF4 ----------------------------------------------------------------- */

static lpx_status nf4_quantize(lpx_tensor *x, int64_t B, int64_t S, lpx_tensor *r[4])
{
    lpx_value args[3] = {lpx_v_tensor(x), lpx_v_i64(B), lpx_v_i64(S)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_nf4_quantize, args, 3);
    for (int i = 0; i < 4; i++) r[i] = NULL;
    lpx_status st = lpx_dispatch(&c);
    if (st) return st;
    if (c.nrets != 4) {
        lpx_call_release_rets(&c);
        return LPX_EINTERNAL;
    }
    for (int i = 0; i < 4; i++) r[i] = c.rets[i].u.t;
    return LPX_OK;
}

static lpx_status nf4_dequantize(lpx_tensor *const p[4], int64_t B, int64_t S, int64_t start, int64_t count,
                                 lpx_dtype dt, lpx_tensor *out, lpx_tensor **res)
{
    lpx_value args[10] = {lpx_v_tensor(p[0]), lpx_v_tensor(p[1]), lpx_v_tensor(p[2]), lpx_v_tensor(p[3]),
                          lpx_v_i64(B), lpx_v_i64(S), lpx_v_i64(start), lpx_v_i64(count), lpx_v_dtype(dt),
                          lpx_v_opt_tensor(out)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_nf4_dequantize, args, 10);
    *res = NULL;
    lpx_status st = lpx_dispatch(&c);
    if (st) return st;
    *res = c.rets[0].u.t;
    return LPX_OK;
}

typedef struct nf4_cfg {
    int64_t B, S;
} nf4_cfg;

static const nf4_cfg NF4_CFGS[] = {{64, 256}, {32, 1}, {64, 1}, {48, 3}, {34, 2}, {4096, 2}};

static void test_nf4_quantize(void)
{
    const int64_t sizes[] = {1, 63, 64 * 256, 64 * 256 * 3 + 5, ((int64_t)1 << 20) + 3};
    for (size_t ci = 0; ci < sizeof NF4_CFGS / sizeof *NF4_CFGS; ci++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int h = 0; h < 3; h++) {
                nf4_cfg cf = NF4_CFGS[ci];
                if (sizes[si] > 100000 && (h || ci > 1)) continue;
                lpx_tensor *xc = gen(HP[h], 1, &sizes[si], 2000 + si * 5 + h, 0.02, SP_FINITE, -1);
                /* an all-zero block */
                if (sizes[si] > 4 * cf.B)
                    for (int64_t i = cf.B; i < 2 * cf.B; i++) wr(xc, i, 0.0);
                lpx_tensor *xg = gpu_up(xc);
                lpx_tensor *a[4], *b[4];
                lpx_status s1 = nf4_quantize(xc, cf.B, cf.S, a), s2 = nf4_quantize(xg, cf.B, cf.S, b);
                if (s1 || s2) printf("  nf4_quantize: %s\n", lpx_last_error());
                CHECK(!s1 && !s2);
                if (!s1 && !s2) {
                    static const char *names[4] = {"codes", "qscalers", "factors", "mean"};
                    for (int i = 0; i < 4; i++) {
                        char what[160];
                        snprintf(what, sizeof what, "nf4_quantize B=%lld S=%lld n=%lld %s: %s", (long long)cf.B,
                                 (long long)cf.S, (long long)sizes[si], lpx_dtype_name(HP[h]), names[i]);
                        CHECKF(gpu_same_bits(what, a[i], b[i]), "%s", what);
                    }
                }
                rel4(a);
                rel4(b);
                lpx_tensor_release(xc);
                lpx_tensor_release(xg);
            }
    /* a transposed (strided) x */
    int64_t shape[2] = {128, 100}, tsh[2] = {100, 128}, tst[2] = {1, 100};
    lpx_tensor *xc = gen(LPX_BF16, 2, shape, 77, 1.0, SP_FINITE, -1), *xg = gpu_up(xc);
    lpx_tensor *tc = view(xc, 2, tsh, tst, 0), *tg = view(xg, 2, tsh, tst, 0);
    lpx_tensor *a[4], *b[4];
    CHECK_OK(nf4_quantize(tc, 64, 4, a));
    CHECK_OK(nf4_quantize(tg, 64, 4, b));
    for (int i = 0; i < 4; i++) CHECK(a[i] && b[i] && gpu_same_bits("nf4_quantize strided", a[i], b[i]));
    rel4(a);
    rel4(b);
    lpx_tensor_release(tc);
    lpx_tensor_release(tg);
    lpx_tensor_release(xc);
    lpx_tensor_release(xg);
    /* errors */
    int64_t n = 64;
    lpx_tensor *zg = NULL;
    CHECK_OK(gzeros(1, &n, LPX_F32, &zg));
    CHECK_ERR(nf4_quantize(zg, 33, 4, b), LPX_EINVAL);
    CHECK_ERR(nf4_quantize(zg, 64, 0, b), LPX_EINVAL);
    lpx_tensor_release(zg);
    CHECK_OK(gzeros(1, &n, LPX_I32, &zg));
    CHECK_ERR(nf4_quantize(zg, 64, 1, b), LPX_EDTYPE);
    lpx_tensor_release(zg);
}

/* The CPU payload moved to the GPU (so dequantize is tested on its own). */
static void payload_up(lpx_tensor *const c[4], lpx_tensor *g[4])
{
    for (int i = 0; i < 4; i++) g[i] = gpu_up(c[i]);
}

static void deq_nf4_same(const char *label, lpx_tensor *const pc[4], lpx_tensor *const pg[4], int64_t B, int64_t S,
                         int64_t start, int64_t count, lpx_dtype dt, lpx_tensor *out_c, lpx_tensor *out_g)
{
    lpx_tensor *a = NULL, *b = NULL;
    lpx_status s1 = nf4_dequantize(pc, B, S, start, count, dt, out_c, &a);
    lpx_status s2 = nf4_dequantize(pg, B, S, start, count, dt, out_g, &b);
    if (s1 || s2) printf("  %s: %s\n", label, lpx_last_error());
    CHECK(!s1 && !s2);
    if (!s1 && !s2) {
        char what[200];
        snprintf(what, sizeof what, "%s B=%lld [%lld, +%lld) -> %s", label, (long long)B, (long long)start,
                 (long long)count, lpx_dtype_name(dt));
        CHECKF(gpu_same_bits(what, a, b), "%s", what);
        if (out_g) CHECK(b == out_g);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
}

static void test_nf4_dequantize(void)
{
    const lpx_dtype outs[3] = {LPX_F32, LPX_BF16, LPX_F16};
    for (size_t ci = 0; ci < sizeof NF4_CFGS / sizeof *NF4_CFGS; ci++) {
        nf4_cfg cf = NF4_CFGS[ci];
        int64_t n = cf.B * cf.S * 5 - 3;
        if (n > 300000) n = cf.B * cf.S * 2 - 3;
        lpx_tensor *xc = gen(LPX_F32, 1, &n, 3000 + ci, 0.5, SP_FINITE, -1);
        lpx_tensor *pc[4], *pg[4];
        CHECK_OK(nf4_quantize(xc, cf.B, cf.S, pc));
        lpx_tensor_release(xc);
        if (!pc[0]) continue;
        payload_up(pc, pg);
        int64_t P = lpx_tensor_numel(pc[0]) * 2;
        const int64_t win[][2] = {{0, P}, {0, n}, {cf.B, 1000}, {3, 77}, {P - 5, 5}, {8, 0}, {17, 2 * cf.B + 1}};
        for (size_t w = 0; w < sizeof win / sizeof *win; w++)
            for (int o = 0; o < 3; o++) {
                int64_t start = win[w][0], count = win[w][1];
                if (start + count > P) count = P - start;
                deq_nf4_same("nf4_dequantize", pc, pg, cf.B, cf.S, start, count, outs[o], NULL, NULL);
                /* into out: aligned, and one element into a buffer */
                for (int mis = 0; mis < 2; mis++) {
                    int64_t len = count + mis;
                    lpx_tensor *bc = NULL, *bg = NULL;
                    CHECK_OK(lpx_zeros(1, &len, outs[o], lpx_cpu(), &bc));
                    CHECK_OK(gzeros(1, &len, outs[o], &bg));
                    int64_t one = 1;
                    lpx_tensor *oc = view(bc, 1, &count, &one, mis), *og = view(bg, 1, &count, &one, mis);
                    deq_nf4_same(mis ? "nf4_dequantize out (misaligned)" : "nf4_dequantize out", pc, pg, cf.B, cf.S,
                                 start, count, outs[o], oc, og);
                    lpx_tensor_release(oc);
                    lpx_tensor_release(og);
                    lpx_tensor_release(bc);
                    lpx_tensor_release(bg);
                }
            }
        /* the payload of scaler blocks 1.. (a dim-0 slice: the codes start
         * block * S / 2 bytes into their buffer) */
        int64_t unit = cf.B * cf.S, nsb = P / unit;
        if (nsb > 1) {
            lpx_tensor *sc[4], *sg[4];
            int64_t lens[4] = {(P - unit) / 2, (P - unit) / cf.B, nsb - 1, 1};
            int64_t offs[4] = {unit / 2, cf.S, 1, 0};
            int64_t one = 1;
            for (int i = 0; i < 4; i++) {
                sc[i] = view(pc[i], 1, &lens[i], &one, offs[i]);
                sg[i] = view(pg[i], 1, &lens[i], &one, offs[i]);
            }
            deq_nf4_same("nf4_dequantize slice", sc, sg, cf.B, cf.S, 0, P - unit, LPX_BF16, NULL, NULL);
            deq_nf4_same("nf4_dequantize slice", sc, sg, cf.B, cf.S, 5, 100, LPX_F32, NULL, NULL);
            for (int i = 0; i < 4; i++) {
                lpx_tensor_release(sc[i]);
                lpx_tensor_release(sg[i]);
            }
        }
        /* extreme block scales (the GPU's hardware conversion is used for
         * finite, not tiny scales only): tiny ones with f32 subnormal
         * values, huge ones that overflow f16 and bf16, negative ones */
        const double fac_mean[3][2] = {{3e38, 1e-39}, {1.0, 3e38}, {0.0, -2.5}};
        for (int k = 0; k < 3; k++) {
            lpx_tensor *mc = NULL, *fc = NULL;
            int64_t one_elem = 1;
            CHECK_OK(lpx_full(1, &one_elem, fac_mean[k][1], LPX_F32, lpx_cpu(), &mc));
            if (fac_mean[k][0] > 0) CHECK_OK(lpx_full(1, lpx_tensor_shape(pc[2]), fac_mean[k][0], LPX_F32, lpx_cpu(), &fc));
            else lpx_tensor_retain(fc = pc[2]);
            lpx_tensor *mg = gpu_up(mc), *fg = gpu_up(fc);
            lpx_tensor *qc[4] = {pc[0], pc[1], fc, mc}, *qg[4] = {pg[0], pg[1], fg, mg};
            for (int o = 0; o < 3; o++)
                deq_nf4_same("nf4_dequantize extreme scales", qc, qg, cf.B, cf.S, 0, P, outs[o], NULL, NULL);
            lpx_tensor_release(mc);
            lpx_tensor_release(mg);
            lpx_tensor_release(fc);
            lpx_tensor_release(fg);
        }
        /* errors */
        lpx_tensor *r = NULL;
        CHECK_ERR(nf4_dequantize(pg, cf.B, cf.S, P - 1, 2, LPX_F32, NULL, &r), LPX_ERANGE);
        CHECK_ERR(nf4_dequantize(pg, cf.B, cf.S, 0, 4, LPX_I32, NULL, &r), LPX_EDTYPE);
        CHECK_ERR(nf4_dequantize(pg, cf.B == 4096 ? 2048 : cf.B * 2, cf.S, 0, 4, LPX_F32, NULL, &r), LPX_ESHAPE);
        lpx_tensor *wrong = NULL;
        int64_t five = 5;
        CHECK_OK(gzeros(1, &five, LPX_F32, &wrong));
        CHECK_ERR(nf4_dequantize(pg, cf.B, cf.S, 0, 4, LPX_F32, wrong, &r), LPX_ESHAPE);
        lpx_tensor_release(wrong);
        rel4(pc);
        rel4(pg);
    }
}

/* Back-to-back kernels that depend on each other, as a training step
 * queues them: NF4 dequantize of payload A or B into one bf16 buffer, then
 * fp8_quantize (dynamic: an amax kernel and a cast kernel) of that buffer,
 * twelve times over with no host wait. Each quantize reads what the
 * dequantize before it wrote (read after write) and the next dequantize
 * overwrites the buffer the quantize before it read (write after read).
 * On sm_90 these kernels are launched with programmatic dependent launch
 * (cuda_launch.cuh): a kernel that touched memory before its grid
 * dependency wait would mix A's and B's values into a result. Every fp8
 * result must be the CPU's for its payload, bit for bit. */
static void test_dependent_chain(void)
{
    const int64_t n = (int64_t)1 << 22; /* 8 MiB of bf16: ~ 60 blocks per SM */
    enum { ROUNDS = 12 };
    lpx_tensor *pc[2][4], *pg[2][4], *ref[2][4];
    for (int k = 0; k < 2; k++) {
        lpx_tensor *xc = gen(LPX_F32, 1, &n, 4100 + k, k ? 3.0 : 0.25, SP_NONE, -1);
        CHECK_OK(nf4_quantize(xc, 64, 256, pc[k]));
        lpx_tensor_release(xc);
        if (!pc[k][0]) return;
        payload_up(pc[k], pg[k]);
        /* the CPU reference: dequantize to bf16, then quantize */
        lpx_tensor *dc = NULL;
        CHECK_OK(nf4_dequantize(pc[k], 64, 256, 0, n, LPX_BF16, NULL, &dc));
        for (int i = 0; i < 4; i++) ref[k][i] = NULL;
        CHECK_OK(lpx_fp8_quantize(dc, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true, &ref[k][0], &ref[k][1], &ref[k][2],
                                  &ref[k][3]));
        lpx_tensor_release(dc);
    }
    lpx_tensor *buf = NULL, *q[ROUNDS][4];
    CHECK_OK(gzeros(1, &n, LPX_BF16, &buf));
    for (int r = 0; r < ROUNDS; r++) {
        lpx_tensor *d = NULL;
        for (int i = 0; i < 4; i++) q[r][i] = NULL;
        CHECK_OK(nf4_dequantize(pg[r % 2], 64, 256, 0, n, LPX_BF16, buf, &d));
        lpx_tensor_release(d);
        CHECK_OK(lpx_fp8_quantize(buf, NULL, LPX_F8E4M3FN, NULL, false, 0.0, true, &q[r][0], &q[r][1], &q[r][2],
                                  &q[r][3]));
    }
    for (int r = 0; r < ROUNDS; r++) {
        static const char *names[4] = {"q", "scale", "scale_inv", "stats"};
        for (int i = 0; i < 4; i++) {
            char what[128];
            snprintf(what, sizeof what, "dependent chain round %d (payload %c): %s", r, "AB"[r % 2], names[i]);
            if (q[r][i]) CHECKF(gpu_same_bits(what, ref[r % 2][i], q[r][i]), "%s", what);
        }
        rel4(q[r]);
    }
    lpx_tensor_release(buf);
    for (int k = 0; k < 2; k++) {
        rel4(pc[k]);
        rel4(pg[k]);
        rel4(ref[k]);
    }
}

/* ---- qlora_dropout --------------------------------------------------------- */

static lpx_status dropout(lpx_tensor *x, double p, int64_t seed, lpx_dtype dt, lpx_tensor **y)
{
    lpx_value args[4] = {lpx_v_tensor(x), lpx_v_f64(p), lpx_v_i64(seed), lpx_v_dtype(dt)};
    lpx_call c;
    lpx_call_init(&c, LPX_OP_qlora_dropout, args, 4);
    *y = NULL;
    lpx_status st = lpx_dispatch(&c);
    if (st) return st;
    *y = c.rets[0].u.t;
    return LPX_OK;
}

static void test_qlora_dropout(void)
{
    const double ps[4] = {0.0, 0.1, 0.5, 0.999};
    const int64_t seeds[3] = {0, 12345, -7};
    const int64_t sizes[3] = {1, 4099, 300003};
    for (int si = 0; si < 3; si++)
        for (int h = 0; h < 3; h++) {
            lpx_tensor *xc = gen(HP[h], 1, &sizes[si], 4000 + si, 1.0, SP_NONFINITE, -1), *xg = gpu_up(xc);
            for (int pi = 0; pi < 4; pi++)
                for (int k = 0; k < 3; k++)
                    for (int o = 0; o < 3; o++) {
                        lpx_tensor *a = NULL, *b = NULL;
                        CHECK_OK(dropout(xc, ps[pi], seeds[k], HP[o], &a));
                        CHECK_OK(dropout(xg, ps[pi], seeds[k], HP[o], &b));
                        char what[160];
                        snprintf(what, sizeof what, "qlora_dropout n=%lld %s p=%g seed=%lld -> %s",
                                 (long long)sizes[si], lpx_dtype_name(HP[h]), ps[pi], (long long)seeds[k],
                                 lpx_dtype_name(HP[o]));
                        CHECKF(a && b && gpu_same_bits(what, a, b), "%s", what);
                        lpx_tensor_release(a);
                        lpx_tensor_release(b);
                    }
            lpx_tensor_release(xc);
            lpx_tensor_release(xg);
        }
    /* strided x */
    int64_t shape[2] = {40, 30}, tsh[2] = {30, 40}, tst[2] = {1, 30};
    lpx_tensor *xc = gen(LPX_F32, 2, shape, 9, 1.0, SP_NONE, -1), *xg = gpu_up(xc);
    lpx_tensor *tc = view(xc, 2, tsh, tst, 0), *tg = view(xg, 2, tsh, tst, 0), *a = NULL, *b = NULL;
    CHECK_OK(dropout(tc, 0.3, 5, LPX_BF16, &a));
    CHECK_OK(dropout(tg, 0.3, 5, LPX_BF16, &b));
    CHECK(a && b && gpu_same_bits("qlora_dropout strided", a, b));
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    CHECK_ERR(dropout(tg, 1.0, 5, LPX_BF16, &a), LPX_EINVAL);
    CHECK_ERR(dropout(tg, 0.5, 5, LPX_I32, &a), LPX_EDTYPE);
    lpx_tensor_release(tc);
    lpx_tensor_release(tg);
    lpx_tensor_release(xc);
    lpx_tensor_release(xg);
}

int main(void)
{
    gpu_setup();
    RUN(test_quantize_tensorwise);
    RUN(test_quantize_clamp_and_zeros);
    RUN(test_quantize_nonfinite_static);
    RUN(test_quantize_rowwise);
    RUN(test_quantize_rowwise_many_rows);
    RUN(test_quantize_axes_and_views);
    RUN(test_scale_formula);
    RUN(test_quantize_nonfinite_dynamic);
    RUN(test_quantize_errors);
    RUN(test_quantize_t);
    RUN(test_transpose_copy);
    RUN(test_dequantize);
    RUN(test_scale_from_amax);
    RUN(test_nf4_quantize);
    RUN(test_nf4_dequantize);
    RUN(test_qlora_dropout);
    RUN(test_dependent_chain);
    return CHECK_DONE();
}
