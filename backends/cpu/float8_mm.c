/* The CPU kernel of fp8_scaled_mm (ops_float8.def): the reference the
 * cuBLASLt path is checked against. The scales factor out of the sum, so
 * the kernel decodes fp8 codes exactly to f32 (decode tables of
 * core/dtype_internal.h), runs sgemm on the raw values, and applies
 * a_scale_inv[m] * b_scale_inv[n] (and bias) to each finished tile of C.
 * A is decoded in tiles of rows x K-panel, B in K-panels; B is decoded
 * once when it fits the scratch budget, else per tile. Operands stay in
 * their storage orientation (column-major ones go to sgemm as CblasTrans),
 * so decoding streams. The contract (shapes, layouts, scales) is
 * lpx_meta_fp8_scaled_mm's, checked by the dispatcher (spec family
 * `fp8_scaled_mm`). */
#include <limits.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "cpu_internal.h"


/* f32 elements of scratch per A tile / C tile, and for a decoded B. */
#define MM_TILE_ELEMS ((int64_t)1 << 20)
#define MM_B_BUDGET ((int64_t)1 << 22)

/* An fp8 operand [R, C] in one of the two layouts sgemm can read once
 * decoded: row-major (elements (r, k) at r*ld + k) or column-major
 * ((r, k) at k*ld + r). */
typedef struct mm_operand {
    const uint8_t *p;
    int64_t rows, cols, ld;
    bool colmajor;
    const float *tab;
} mm_operand;

static lpx_status mm_layout(const lpx_call *c, const char *arg, const lpx_tensor *t, mm_operand *o)
{
    int64_t R = t->shape[0], C = t->shape[1], s0 = t->strides[0], s1 = t->strides[1];
    o->p = lpx_tensor_data(t);
    o->rows = R;
    o->cols = C;
    o->tab = cpu_f8_decode_table(t->dtype);
    /* size-1 dims have no meaningful stride */
    /* row- or column-major: lpx_meta_fp8_scaled_mm (the spec) checked it */
    bool row = (C <= 1 || s1 == 1) && (R <= 1 || s0 >= C);
    if (row) {
        o->colmajor = false;
        o->ld = R <= 1 ? (C > 0 ? C : 1) : s0;
    } else {
        o->colmajor = true;
        o->ld = C <= 1 ? (R > 0 ? R : 1) : s1;
    }
    if (o->ld > INT_MAX)   /* sgemm's int leading dimension: this backend's limit */
        return lpx_error(LPX_ERANGE, "%s: %s has a leading dimension %lld beyond the BLAS int range", cpu_op_name(c),
                         arg, (long long)o->ld);
    return LPX_OK;
}

/* Decodes a sub-block of an operand keeping its storage orientation:
 * rows [r0, r0+nr) x cols [c0, c0+nc). Row-major: dst is nr x nc (ld nc);
 * column-major: dst is nc x nr (ld nr), the block's transpose. Returns
 * whether sgemm must read it transposed. */
static bool mm_decode(const mm_operand *o, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst)
{
    const float *tab = o->tab;
    if (!o->colmajor) {
        for (int64_t r = 0; r < nr; r++) {
            const uint8_t *src = o->p + (r0 + r) * o->ld + c0;
            float *d = dst + r * nc;
            for (int64_t k = 0; k < nc; k++) d[k] = tab[src[k]];
        }
        return false;
    }
    for (int64_t k = 0; k < nc; k++) {
        const uint8_t *src = o->p + (c0 + k) * o->ld + r0;
        float *d = dst + k * nr;
        for (int64_t r = 0; r < nr; r++) d[r] = tab[src[r]];
    }
    return true;
}

/* Reads a scale_inv (numel 1, or n values: `per`, as lpx_meta_fp8_scaled_mm
 * found) into dst[0..n). */
static void mm_scales(const lpx_tensor *s, int64_t n, bool per, float *dst)
{
    cpu_view v;
    if (!per) cpu_view_init(&v, s, 0, NULL);
    else cpu_view_of(&v, s);
    cpu_load_f32(&v, 0, per ? n : 1, dst);
}

static lpx_status k_fp8_scaled_mm(lpx_call *c)
{
    const lpx_fp8_scaled_mm_args *args = lpx_op_args_of(c);
    lpx_tensor *a = args->a, *as = args->a_scale_inv, *b = args->b, *bs = args->b_scale_inv, *bias = args->bias;
    lpx_dtype odt = args->out_dtype;
    const char *op = cpu_op_name(c);
    lpx_status st;
    const lpx_fp8_mm_geom g = args->g;
    int64_t M = g.M, K = g.K, N = g.N;
    /* sgemm's int sizes: what this backend has no code for */
    if (N > INT_MAX || K > INT_MAX || M > INT_MAX)
        return lpx_error(LPX_ERANGE, "%s: M, N or K beyond the BLAS int range", op);
    mm_operand oa, ob;
    if ((st = mm_layout(c, "a", a, &oa)) || (st = mm_layout(c, "b", b, &ob))) return st;
    float *sa_v = lpx_malloc((size_t)(M + N + 2) * sizeof(float));
    if (!sa_v) return lpx_error(LPX_ENOMEM, "%s: cannot allocate the scale vectors", op);
    float *sb_v = sa_v + M + 1;
    bool a_per = g.a_rowwise, b_per = g.b_colwise;
    mm_scales(as, M, a_per, sa_v);
    mm_scales(bs, N, b_per, sb_v);
    lpx_tensor *out;
    int64_t oshape[2] = {M, N};
    if ((st = cpu_new(c, odt, 2, oshape, &out))) {
        lpx_free(sa_v);
        return st;
    }
    if (M == 0 || N == 0) {
        lpx_free(sa_v);
        cpu_ret(c, out);
        return LPX_OK;
    }
    /* K panel kb: all of K when B fits the budget (decoded once), else
     * panels of B of about the budget; A tile mb x kb and C tile mb x N
     * each about MM_TILE_ELEMS */
    int64_t kb = K;
    if (K * N > MM_B_BUDGET) {
        kb = MM_B_BUDGET / N;
        if (kb < 64) kb = 64;
        if (kb > K) kb = K;
    }
    if (kb < 1) kb = 1;
    bool b_once = kb == K && K > 0;
    int64_t wide = kb > N ? kb : N;
    int64_t mb = MM_TILE_ELEMS / wide;
    mb = mb < 1 ? 1 : mb > M ? M : mb;
    bool direct = odt == LPX_F32;
    float *abuf = lpx_malloc((size_t)(mb * kb) * sizeof(float));
    float *bbuf = lpx_malloc((size_t)(kb * N) * sizeof(float));
    float *cbuf = direct ? NULL : lpx_malloc((size_t)(mb * N) * sizeof(float));
    float *biasv = bias ? lpx_malloc((size_t)N * sizeof(float)) : NULL;
    if (!abuf || !bbuf || (!direct && !cbuf) || (bias && !biasv)) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate f32 scratch (tiles of %lld x %lld, panel %lld x %lld)", op,
                       (long long)mb, (long long)kb, (long long)kb, (long long)N);
        goto done;
    }
    if (bias) {
        cpu_view vb;
        cpu_view_of(&vb, bias);
        cpu_load_f32(&vb, 0, N, biasv);
    }
    cpu_view vo;
    cpu_view_of(&vo, out);
    bool tb = false;
    if (b_once) tb = mm_decode(&ob, 0, K, 0, N, bbuf);
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
        int64_t nm = M - m0 < mb ? M - m0 : mb;
        float *cp = direct ? (float *)lpx_tensor_data(out) + m0 * N : cbuf;
        if (K == 0) memset(cp, 0, (size_t)(nm * N) * sizeof(float));
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            int64_t nk = K - k0 < kb ? K - k0 : kb;
            bool ta = mm_decode(&oa, m0, nm, k0, nk, abuf);
            if (!b_once) tb = mm_decode(&ob, k0, nk, 0, N, bbuf);
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)nm,
                        (int)N, (int)nk, 1.0f, abuf, ta ? (int)nm : (int)nk, bbuf, tb ? (int)nk : (int)N,
                        k0 == 0 ? 0.0f : 1.0f, cp, (int)N);
        }
        /* epilogue: scales, bias */
        for (int64_t i = 0; i < nm; i++) {
            float *row = cp + i * N;
            float fa = a_per ? sa_v[m0 + i] : sa_v[0];
            if (b_per) {
                for (int64_t n = 0; n < N; n++) row[n] *= fa * sb_v[n];
            } else {
                float f = fa * sb_v[0];
                for (int64_t n = 0; n < N; n++) row[n] *= f;
            }
            if (biasv)
                for (int64_t n = 0; n < N; n++) row[n] += biasv[n];
        }
        if (!direct) cpu_store_f32(&vo, m0 * N, nm * N, cbuf, 0);
    }
done:
    lpx_free(abuf);
    lpx_free(bbuf);
    lpx_free(cbuf);
    lpx_free(biasv);
    lpx_free(sa_v);
    if (st) {
        lpx_tensor_release(out);
        return st;
    }
    cpu_ret(c, out);
    return LPX_OK;
}

lpx_status lpx_cpu_register_float8_mm(void) { return cpu_reg(LPX_OP_fp8_scaled_mm, k_fp8_scaled_mm); }
