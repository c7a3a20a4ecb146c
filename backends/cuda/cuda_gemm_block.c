/* fp8_mm_block through cuBLASLt's block-scaled fp8 GEMM (Hopper, cuBLASLt
 * 12.9+): scales per 128 elements of K, for each operand either one per row
 * (cuBLASLt's VEC128_32F, lpx's 1 x 128 blocks of an activation or a
 * gradient) or one per 128 x 128 block (BLK128x128_32F, lpx's weights), as
 * DeepSeek-V3 and TransformerEngine's Float8BlockScaling run it. Not both
 * operands 128 x 128 (cuBLASLt has no such kernel).
 *
 * cuBLASLt computes D^T = B^T A^T in column-major terms, so its A is lpx b
 * (read as [N, K], K contiguous) and its B is lpx a ([M, K], K contiguous):
 * operands in another layout, or with rows not 16-byte aligned, are packed
 * K-major first (cu_gemm_pack8, zero padding to a multiple of 16 in K: the
 * zeros add nothing and the block count does not change). The scales go
 * into the layouts cuBLASLt reads (cu_gemm_gather2d_f32), lpx's scale_inv
 * being cuBLASLt's multiplicative dequantization scale:
 *   VEC128 of an operand with R rows:  s[kb * R + r]        (R a multiple of 4)
 *   BLK128 of an operand with R rows:  s[rb * KBp + kb]     (KBp: K blocks rounded up to 4)
 * These layouts come from how PyTorch's _scaled_mm and TransformerEngine
 * hand cuBLASLt their blockwise scales (1 x 128 scales outer-dim-major, the
 * token count a multiple of 4; 128 x 128 scales with the K blocks padded to
 * 4). Because a wrong layout would give wrong numbers rather than an error,
 * each (device, A mode, B mode, output dtype) is checked once against exact
 * arithmetic on a small problem with scales that differ per block and per
 * row before it is used (cu_gemm_fp8_block_check); a mismatch turns the
 * path off for the process and `lpx info` says so. The caller runs lpx's
 * reference kernel whenever this returns without running. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/plugin.h"
#include "cuda_gemm_internal.h"
#include "cuda_gemm_block.h"

#define BG_MAX_DEV CU_MAX_DEVICES

enum { BG_UNKNOWN = 0, BG_OK = 1, BG_OFF = 2 };

/* verdict per device and combination: [a mode 1..2][b mode 1..2][out dtype f32/bf16/f16] */
static int bg_state[BG_MAX_DEV][3][3][3];
static char bg_why[256] = "not used yet";
static pthread_mutex_t bg_lock = PTHREAD_MUTEX_INITIALIZER;

static int out_index(lpx_dtype d) { return d == LPX_BF16 ? 1 : d == LPX_F16 ? 2 : 0; }

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* the mode of an operand from its blocks: rows of the block across K's
 * other dim (1: VEC128, 128: BLK128), 0 when cuBLASLt has none */
static int mode_of(int64_t across) { return across == 1 ? GM_BLOCK_VEC128 : across == 128 ? GM_BLOCK_BLK128 : 0; }

/* One block-scaled GEMM on raw device operands: a [M, K] (rows a_rs
 * elements apart, unit K stride), bT [N, K] likewise, scales already in
 * cuBLASLt's layouts. */
static lpx_status run_raw(const char *op, int dev, int64_t M, int64_t N, int64_t K, const void *a, int64_t a_rs,
                          lpx_dtype adt, int amode, const float *as, const void *bT, int64_t b_rs, lpx_dtype bdt,
                          int bmode, const float *bs, void *y, lpx_dtype odt)
{
    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = dev;
    p.M = M, p.N = N, p.K = K, p.batch = 1;
    p.a = a, p.a_rs = a_rs, p.a_cs = 1;
    p.b = bT, p.b_rs = 1, p.b_cs = b_rs;
    p.ab_dt = adt, p.b_dt = bdt;
    p.d = y, p.ldd = N, p.d_dt = odt;
    p.alpha = 1.0f;
    p.scale_mode = GM_SCALE_BLOCK;
    p.a_scale = as, p.b_scale = bs;
    p.a_block = amode, p.b_block = bmode;
    return cu_gemm_run(op, &p);
}

/* scale buffer of an operand with R rows and KB K blocks in cuBLASLt's
 * layout, from an lpx grid read through element strides: (r, kb) of the
 * grid at src + r * rs + kb * cs */
static lpx_status scales_of(const char *op, int dev, int mode, const void *src, lpx_dtype dt, int64_t R, int64_t KB,
                            int64_t rs, int64_t cs, gm_scratch *sc, float **out)
{
    if (mode == GM_BLOCK_VEC128) {
        /* s[kb * R + r] */
        *out = cu_gemm_scratch_get(sc, (size_t)(KB * R) * sizeof(float));
        if (!*out) return lpx_error(LPX_ENOMEM, "%s: device scratch for block scales", op);
        return cu_gemm_gather2d_f32(op, dev, src, dt, KB, R, cs, rs, *out, KB, R);
    }
    /* s[rb * KBp + kb], R here counts row blocks */
    int64_t KBp = round_up(KB, 4);
    *out = cu_gemm_scratch_get(sc, (size_t)(R * KBp) * sizeof(float));
    if (!*out) return lpx_error(LPX_ENOMEM, "%s: device scratch for block scales", op);
    return cu_gemm_gather2d_f32(op, dev, src, dt, R, KB, rs, cs, *out, R, KBp);
}

/* Checks (device, amode, bmode, odt) once: exact integer fp8 data, power
 * of two scales differing per row, per row block and per K block, against
 * the exact product (double) within the output's rounding. */
static int check_combo(const char *op, int dev, int amode, int bmode, lpx_dtype odt)
{
    /* K = 336: two whole K blocks and a partial one (80 codes) */
    enum { M = 256, N = 256, K = 336, KB = 3 };
    const int64_t MR = amode == GM_BLOCK_VEC128 ? M : M / 128, NR = bmode == GM_BLOCK_VEC128 ? N : N / 128;
    uint8_t *ha = malloc(M * K), *hb = malloc(N * K);
    float *hsa = malloc(sizeof(float) * (size_t)(MR * KB)), *hsb = malloc(sizeof(float) * (size_t)(NR * KB));
    double *ref = malloc(sizeof(double) * M * N);
    float *hy = malloc(sizeof(float) * M * N);
    gm_scratch sc = {.dev = dev};
    int verdict = BG_OFF;
    char why[200] = "";
    if (!ha || !hb || !hsa || !hsb || !ref || !hy) {
        snprintf(why, sizeof why, "out of host memory for the self-check");
        goto out;
    }
    /* e4m3 codes of small integers: 0 -> 0x00, +-1 -> 0x38/0xB8, +-2 -> 0x40/0xC0 */
    static const uint8_t codes[5] = {0xC0, 0xB8, 0x00, 0x38, 0x40};
    static const double vals[5] = {-2, -1, 0, 1, 2};
    for (int i = 0; i < M * K; i++) ha[i] = codes[(i * 7 + i / K * 3) % 5];
    for (int i = 0; i < N * K; i++) hb[i] = codes[(i * 11 + i / K * 5 + 1) % 5];
    for (int r = 0; r < MR; r++)
        for (int kb = 0; kb < KB; kb++) hsa[r * KB + kb] = ldexpf(1.0f, (r * 3 + kb * 2) % 5 - 2);
    for (int r = 0; r < NR; r++)
        for (int kb = 0; kb < KB; kb++) hsb[r * KB + kb] = ldexpf(1.0f, (r * 2 + kb * 3) % 4 - 1);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int kb = 0; kb < KB; kb++) {
                double part = 0;
                for (int k = kb * 128; k < kb * 128 + 128 && k < K; k++) {
                    int ia = (m * K + k), ib = (n * K + k);
                    part += vals[(ia * 7 + ia / K * 3) % 5] * vals[(ib * 11 + ib / K * 5 + 1) % 5];
                }
                int ra = amode == GM_BLOCK_VEC128 ? m : m / 128, rb = bmode == GM_BLOCK_VEC128 ? n : n / 128;
                acc += part * hsa[ra * KB + kb] * hsb[rb * KB + kb];
            }
            ref[m * N + n] = acc;
        }
    void *da = cu_gemm_scratch_get(&sc, M * K), *db = cu_gemm_scratch_get(&sc, N * K),
         *dsa = cu_gemm_scratch_get(&sc, sizeof(float) * (size_t)(MR * KB)),
         *dsb = cu_gemm_scratch_get(&sc, sizeof(float) * (size_t)(NR * KB)),
         *dy = cu_gemm_scratch_get(&sc, sizeof(float) * M * N);
    if (!da || !db || !dsa || !dsb || !dy) {
        snprintf(why, sizeof why, "out of device memory for the self-check");
        goto out;
    }
    cudaStream_t s = cu_stream(dev);
    if (cudaMemcpyAsync(da, ha, M * K, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        cudaMemcpyAsync(db, hb, N * K, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        cudaMemcpyAsync(dsa, hsa, sizeof(float) * (size_t)(MR * KB), cudaMemcpyHostToDevice, s) != cudaSuccess ||
        cudaMemcpyAsync(dsb, hsb, sizeof(float) * (size_t)(NR * KB), cudaMemcpyHostToDevice, s) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, sizeof why, "self-check upload failed");
        goto out;
    }
    /* the grids as lpx holds them ([rows, KB] row-major), laid out for cuBLASLt */
    float *csa = NULL, *csb = NULL;
    lpx_status st = scales_of(op, dev, amode, dsa, LPX_F32, MR, KB, KB, 1, &sc, &csa);
    if (!st) st = scales_of(op, dev, bmode, dsb, LPX_F32, NR, KB, KB, 1, &sc, &csb);
    if (!st)
        st = run_raw(op, dev, M, N, K, da, K, LPX_F8E4M3FN, amode, csa, db, K, LPX_F8E4M3FN, bmode, csb, dy, odt);
    if (st) {
        snprintf(why, sizeof why, "cuBLASLt has no kernel (%s)", lpx_last_error());
        lpx_clear_error();
        goto out;
    }
    size_t es = odt == LPX_F32 ? 4 : 2;
    uint16_t *h16 = (uint16_t *)hy;
    if (cudaMemcpyAsync(hy, dy, es * M * N, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, sizeof why, "self-check download failed");
        goto out;
    }
    double tol = odt == LPX_F32 ? 1e-6 : odt == LPX_BF16 ? 1.0 / 128 : 1.0 / 1024;
    for (int i = 0; i < M * N; i++) {
        double got;
        if (odt == LPX_F32) got = hy[i];
        else {
            uint32_t w = odt == LPX_BF16 ? (uint32_t)h16[i] << 16 : 0;
            float f;
            if (odt == LPX_BF16) memcpy(&f, &w, sizeof f);
            else {
                /* f16 -> f32 */
                uint16_t h = h16[i];
                int e = (h >> 10) & 31, mnt = h & 1023;
                double v = e == 0 ? ldexp(mnt, -24) : ldexp(1024 + mnt, e - 25);
                f = (float)((h & 0x8000) ? -v : v);
            }
            got = f;
        }
        if (fabs(got - ref[i]) > tol * fabs(ref[i]) + 1e-6) {
            snprintf(why, sizeof why, "self-check mismatch at (%d, %d): %g, expected %g (scale layout)", i / N, i % N,
                     got, ref[i]);
            goto out;
        }
    }
    verdict = BG_OK;
out:
    cu_gemm_scratch_free(&sc);
    if (verdict != BG_OK) snprintf(bg_why, sizeof bg_why, "%s", why);
    free(ha);
    free(hb);
    free(hsa);
    free(hsb);
    free(ref);
    free(hy);
    return verdict;
}

/* *p, an operand of R rows of K fp8 codes (element (r, k) at r * rs + k *
 * cs), as cuBLASLt reads it: K-major with 16-byte aligned rows as it is
 * (*ld = rs), else packed into scratch with rows of Kp (*ld = Kp, zero
 * padding) */
static lpx_status kmajor(const char *op, int dev, const void **p, int64_t R, int64_t K, int64_t rs, int64_t cs,
                         int64_t Kp, int64_t *ld, gm_scratch *sc)
{
    /* as it is only when K needs no padding: a padded K would read the
     * other operand's bytes past K (NaN codes there would not vanish) */
    *ld = rs;
    if (K == Kp && cs == 1 && rs % 16 == 0 && (R <= 1 || rs >= K) && ((uintptr_t)*p & 15) == 0) return LPX_OK;
    void *q = cu_gemm_scratch_get(sc, (size_t)(R * Kp));
    if (!q) return lpx_error(LPX_ENOMEM, "%s: device scratch for a K-major copy of an operand", op);
    lpx_status st = cu_gemm_pack8(op, dev, *p, R, K, rs, cs, q, R, Kp);
    *p = q;
    *ld = Kp;
    return st;
}

lpx_status cu_gemm_fp8_block(const char *op, const cu_block_mm *x, bool *ran)
{
    *ran = false;
    int amode = mode_of(x->a_block_rows), bmode = mode_of(x->b_block_cols);
    const char *off = getenv("LPX_CUDA_BLOCK_GEMM");
    if (off && !strcmp(off, "reference")) return LPX_OK;
    if (x->k_block != 128 || !amode || !bmode || (amode == GM_BLOCK_BLK128 && bmode == GM_BLOCK_BLK128) || x->bias)
        return LPX_OK;
    if ((amode == GM_BLOCK_VEC128 && x->M % 4) || (bmode == GM_BLOCK_VEC128 && x->N % 4)) return LPX_OK;
    if (x->odt != LPX_F32 && x->odt != LPX_BF16 && x->odt != LPX_F16) return LPX_OK;
    /* e4m3 operands only: what the self-check covers (DeepSeek-V3 and TE's
     * blockwise recipe are e4m3 everywhere) */
    if (x->adt != LPX_F8E4M3FN || x->bdt != LPX_F8E4M3FN) return LPX_OK;
    if (x->dev < 0 || x->dev >= BG_MAX_DEV) return LPX_OK;
    pthread_mutex_lock(&bg_lock);
    int *v = &bg_state[x->dev][amode][bmode][out_index(x->odt)];
    if (*v == BG_UNKNOWN) *v = check_combo(op, x->dev, amode, bmode, x->odt);
    int verdict = *v;
    pthread_mutex_unlock(&bg_lock);
    if (verdict != BG_OK) return LPX_OK;

    lpx_status st = LPX_OK;
    gm_scratch sc = {.dev = x->dev};
    int64_t M = x->M, N = x->N, K = x->K, KB = (K + 127) / 128, Kp = round_up(K, 16);
    /* a as [M, K] K-major with 16-byte rows, b as [N, K] likewise */
    const void *a = x->a, *b = x->b;
    int64_t lda = x->a_rs, ldb = x->b_cs;
    if ((st = kmajor(op, x->dev, &a, M, K, x->a_rs, x->a_cs, Kp, &lda, &sc)) ||
        (st = kmajor(op, x->dev, &b, N, K, x->b_cs, x->b_rs, Kp, &ldb, &sc)))
        goto out;
    float *as = NULL, *bs = NULL;
    /* a's grid [rows of a / a_block_rows, KB]; b's grid [KB, N / b_block_cols] */
    int64_t ar = amode == GM_BLOCK_VEC128 ? M : (M + 127) / 128, br = bmode == GM_BLOCK_VEC128 ? N : (N + 127) / 128;
    if ((st = scales_of(op, x->dev, amode, x->as, x->as_dt, ar, KB, x->as_rs, x->as_cs, &sc, &as)) ||
        (st = scales_of(op, x->dev, bmode, x->bs, x->bs_dt, br, KB, x->bs_cs, x->bs_rs, &sc, &bs)))
        goto out;
    /* Kp: K itself unless K is not a multiple of 16 (then both were packed) */
    st = run_raw(op, x->dev, M, N, Kp, a, lda, x->adt, amode, as, b, ldb, x->bdt, bmode, bs, x->y, x->odt);
    if (!st) *ran = true;
out:
    if (st && st != LPX_EDEVICE) {
        /* no kernel for this shape, a layout or size cuBLASLt does not
         * take, no scratch: the reference runs (a CUDA error is reported) */
        lpx_clear_error();
        st = LPX_OK;
    }
    cu_gemm_scratch_free(&sc);
    return st;
}

int cu_gemm_fp8_block_describe(char *buf, size_t n)
{
    pthread_mutex_lock(&bg_lock);
    int ok = 0, off = 0;
    for (int d = 0; d < BG_MAX_DEV; d++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                for (int o = 0; o < 3; o++) {
                    ok += bg_state[d][i][j][o] == BG_OK;
                    off += bg_state[d][i][j][o] == BG_OFF;
                }
#if GM_HAVE_OUTER_VEC
    const char *lt = "cuBLASLt block scaling (VEC128 / BLK128x128, checked once per kind against exact arithmetic)";
#else
    const char *lt = NULL;
#endif
    if (!lt) snprintf(buf, n, "lpx reference kernel (built with cuBLASLt older than 12.9: no block scaling)");
    else if (off && !ok) snprintf(buf, n, "lpx reference kernel (%s off: %s)", lt, bg_why);
    else if (ok) snprintf(buf, n, "%s; lpx reference kernel for other blocks%s%s", lt, off ? "; off for some: " : "",
                          off ? bg_why : "");
    else snprintf(buf, n, "%s when the blocks fit (1 x 128 / 128 x 128, not both 128 x 128), else lpx reference kernel",
                  lt);
    pthread_mutex_unlock(&bg_lock);
    return ok;
}

LPX_PLUGIN_EXPORT int lpx_cuda_block_gemm_path(char *buf, size_t n) { return cu_gemm_fp8_block_describe(buf, n); }
