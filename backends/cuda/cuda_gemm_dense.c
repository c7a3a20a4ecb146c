/* matmul, linear and addmm (f32, f16, bf16; mixed dtypes in f32) on the
 * GPU: their contracts and output shapes are the dispatcher's (spec
 * families `matmul`, `linear`, `addmm`; the CPU kernels are
 * backends/cpu/linalg.c), operands cuBLASLt can read in place or
 * contiguous copies (cu_gemm_operand_of, also used by nf4_mm), and the
 * gm_problem each op hands to cu_gemm_run (cuda_gemm_plan.c, where the
 * layout mapping and numerics are described). Split from the former
 * cuda_gemm.c: the dense float GEMM ops, apart from the cuBLASLt engine
 * and the low-precision GEMMs. */
#include <stdint.h>
#include <string.h>
#include "cuda_gemm_internal.h"

/* ---- helpers of the ops --------------------------------------------------- */

/* New contiguous tensor of `shape` and dtype dt holding x (broadcast,
 * converted once). */
static lpx_status gm_copy_as(lpx_call *c, const lpx_tensor *x, lpx_dtype dt, int ndim, const int64_t *shape,
                             lpx_tensor **out)
{
    lpx_status st = cu_new(c, dt, ndim, shape, lpx_tensor_device(x), out);
    if (st) return st;
    if ((st = cu_copy_convert(c, *out, x, false))) {
        lpx_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* The leading dims of t (all but the last) as one run of rows with a
 * single stride, if its strides allow (the CPU's collapse_rows). */
static bool gm_collapse_rows(const lpx_tensor *t, int64_t *rs)
{
    int nd = lpx_tensor_ndim(t);
    const int64_t *sh = lpx_tensor_shape(t), *str = lpx_tensor_strides(t);
    bool have = false;
    int64_t s = 0, span = 1;
    for (int d = nd - 2; d >= 0; d--) {
        if (sh[d] == 1) continue;
        if (!have) {
            s = str[d];
            span = sh[d];
            have = true;
        } else {
            if (str[d] != s * span) return false;
            span *= sh[d];
        }
    }
    *rs = s;
    return true;
}

/* A float operand as the GEMM reads it (gm_operand, cuda_gemm_internal.h). */
lpx_status cu_gemm_operand_of(lpx_call *c, lpx_tensor *t, lpx_dtype want, bool batched, int64_t rows, int64_t cols,
                              bool prefer_col, gm_operand *o)
{
    memset(o, 0, sizeof *o);
    int nd = lpx_tensor_ndim(t);
    const int64_t *str = lpx_tensor_strides(t);
    bool ok = lpx_tensor_dtype(t) == want;
    if (ok) {
        o->cs = str[nd - 1];
        if (batched) {
            o->rs = str[nd - 2];
            o->bs = nd == 3 ? str[0] : 0;
        } else {
            ok = gm_collapse_rows(t, &o->rs);
        }
    }
    bool col;
    int64_t ld;
    if (ok && cu_gemm_orient(rows, cols, o->rs, o->cs, prefer_col, &col, &ld)) {
        o->p = lpx_tensor_data(t);
        return LPX_OK;
    }
    lpx_status st = gm_copy_as(c, t, want, nd, lpx_tensor_shape(t), &o->own);
    if (st) return st;
    o->p = lpx_tensor_data(o->own);
    o->cs = 1;
    o->rs = cols;
    o->bs = batched && nd == 3 ? rows * cols : 0;
    return LPX_OK;
}

void cu_gemm_operand_release(gm_operand *o)
{
    lpx_tensor_release(o->own);
    o->own = NULL;
}

/* Zero-fills n elements of dtype dt at p (0 bits are +0 in every float
 * dtype). */
static lpx_status gm_zero(const char *op, int dev, void *p, size_t bytes)
{
    if (!bytes) return LPX_OK;
    CU_CHECK(op, cudaMemsetAsync(p, 0, bytes, cu_stream(dev)));
    return LPX_OK;
}

/* K = 0 with an addend or a bias: the GEMM runs with K = 1 over zero
 * operands, so D = beta * C (+ bias) exactly as cuBLASLt writes it. */
static lpx_status gm_zero_k(gm_problem *p, gm_scratch *s, const char *op)
{
    int64_t n = p->M > p->N ? p->M : p->N;
    size_t bytes = (size_t)n * cu_gemm_es(p->ab_dt);
    void *z = cu_gemm_scratch_get(s, bytes);
    if (!z) return lpx_error(LPX_ENOMEM, "%s: cannot allocate %zu bytes of device scratch", op, bytes);
    lpx_status st = gm_zero(op, p->dev, z, bytes);
    if (st) return st;
    p->K = 1;
    p->a = p->b = z;
    p->a_rs = p->a_cs = p->b_rs = p->b_cs = 1;
    p->a_bs = p->b_bs = 0;
    p->b_dt = p->ab_dt;
    return LPX_OK;
}

/* ---- matmul ---------------------------------------------------------------- */

static lpx_status k_matmul(lpx_call *c)
{
    /* matmul's whole contract is the dispatcher's (spec family `matmul`,
     * op_args.h): the tensors are dense, on one device, of float dtypes */
    const lpx_matmul_args *m = (const lpx_matmul_args *)lpx_op_args_of(c);
    lpx_tensor *a = m->a, *b = m->b, *out = m->out;
    const char *op = cu_op(c);
    lpx_status st;
    const lpx_gemm_geom g = m->g;
    int and_ = lpx_tensor_ndim(a);
    int64_t K = g.K, N = g.N, M = g.M, batch = g.batch, Ba = g.a_batch, Bb = g.b_batch;
    int ond = g.out_ndim;
    const int64_t *oshape = g.out_shape;
    bool batched = lpx_tensor_ndim(b) == 3;
    lpx_dtype T = lpx_tensor_dtype(a) == lpx_tensor_dtype(b) && cu_gemm_hp(lpx_tensor_dtype(a)) ? lpx_tensor_dtype(a)
                                                                                          : LPX_F32;
    lpx_dtype R = lpx_tensor_dtype(a);
    lpx_device dev = lpx_tensor_device(a);
    bool direct = false;
    if (out) {
        direct = R == T && lpx_tensor_is_contiguous(out) && !lpx_tensor_shares_storage(out, a) &&
                 !lpx_tensor_shares_storage(out, b);
    }
    if ((st = cu_use(op, dev))) return st;
    /* the result (and D, when it can take cuBLASLt's output) */
    lpx_tensor *res = NULL, *dt = NULL;
    if (!out && (st = cu_new(c, R, ond, oshape, dev, &res))) return st;
    if (direct) dt = out;
    else if (!out && R == T) dt = res;
    else if ((st = cu_new(c, T, ond, oshape, dev, &dt))) goto done_early;
    if (batch == 0 || M == 0 || N == 0) goto empty;
    if (K == 0) {
        if ((st = gm_zero(op, dev.index, lpx_tensor_data(dt), (size_t)(batch * M * N) * cu_gemm_es(T)))) goto done_early;
        goto finish;
    }
    {
        gm_operand oa, ob;
        if ((st = cu_gemm_operand_of(c, a, T, batched, M, K, false, &oa))) goto done_early;
        if ((st = cu_gemm_operand_of(c, b, T, batched, K, N, true, &ob))) {
            cu_gemm_operand_release(&oa);
            goto done_early;
        }
        if (batched && and_ < 3) oa.bs = 0;
        gm_problem p;
        memset(&p, 0, sizeof p);
        p.dev = dev.index;
        p.M = M;
        p.N = N;
        p.K = K;
        p.ab_dt = p.b_dt = p.d_dt = T;
        p.a_rs = oa.rs;
        p.a_cs = oa.cs;
        p.b_rs = ob.rs;
        p.b_cs = ob.cs;
        p.ldd = N;
        p.alpha = 1.0f;
        size_t es = cu_gemm_es(T);
        /* strided batches when both operands have their own (a zero batch
         * stride, e.g. from expand, goes through the loop too) */
        if (batch == 1 || (Ba == Bb && oa.bs != 0 && ob.bs != 0)) {
            p.batch = batch;
            p.a = oa.p;
            p.b = ob.p;
            p.a_bs = oa.bs;
            p.b_bs = ob.bs;
            p.d = lpx_tensor_data(dt);
            p.d_bs = M * N;
            st = cu_gemm_run(op, &p);
        } else {
            /* one operand shared by the batch: one GEMM per batch */
            p.batch = 1;
            for (int64_t i = 0; i < batch && !st; i++) {
                p.a = (const char *)oa.p + (size_t)(Ba == 1 ? 0 : i * oa.bs) * es;
                p.b = (const char *)ob.p + (size_t)(Bb == 1 ? 0 : i * ob.bs) * es;
                /* (a negative batch stride never comes from lpx views) */
                p.d = (char *)lpx_tensor_data(dt) + (size_t)(i * M * N) * es;
                st = cu_gemm_run(op, &p);
            }
        }
        cu_gemm_operand_release(&oa);
        cu_gemm_operand_release(&ob);
        if (st) goto done_early;
    }
finish:
    if (dt != res && dt != out) {
        /* into the result dtype / the caller's out (which may alias a or b) */
        st = cu_copy_convert(c, out ? out : res, dt, false);
        lpx_tensor_release(dt);
        dt = NULL;
        if (st) goto done_early;
    }
empty:
    if (dt != res && dt != out) lpx_tensor_release(dt);
    if (out) {
        lpx_tensor_retain(out);
        cu_ret(c, out);
    } else {
        cu_ret(c, res);
    }
    return LPX_OK;
done_early:
    if (dt && dt != res && dt != out) lpx_tensor_release(dt);
    lpx_tensor_release(res);
    return st;
}

/* ---- linear, addmm ------------------------------------------------------------ */

/* A [n] vector of dtype dt with unit stride, as the bias pointer: t itself
 * or a converted copy (own). */
lpx_status cu_gemm_vector(lpx_call *c, lpx_tensor *t, lpx_dtype dt, int64_t n, lpx_tensor **own, const void **p)
{
    *own = NULL;
    int nd = lpx_tensor_ndim(t);
    if (lpx_tensor_dtype(t) == dt && (n <= 1 || lpx_tensor_strides(t)[nd - 1] == 1)) {
        *p = lpx_tensor_data(t);
        return LPX_OK;
    }
    lpx_status st = gm_copy_as(c, t, dt, 1, &n, own);
    if (st) return st;
    *p = lpx_tensor_data(*own);
    return LPX_OK;
}

/* Shared tail of linear and addmm: runs p (D = a new [.., N] tensor in
 * dtype T, then converted to R if they differ) and returns the result. */
static lpx_status gm_finish_2d(lpx_call *c, gm_problem *p, lpx_dtype R, int ond, const int64_t *oshape)
{
    const char *op = cu_op(c);
    lpx_device dev = lpx_cuda_device(p->dev);
    lpx_tensor *res = NULL, *dt = NULL;
    gm_scratch s = {.dev = p->dev};
    lpx_status st = cu_new(c, R, ond, oshape, dev, &res);
    if (st) return st;
    if (p->d_dt != R && (st = cu_new(c, p->d_dt, ond, oshape, dev, &dt))) goto done;
    if (p->M == 0 || p->N == 0) goto done;
    p->d = lpx_tensor_data(dt ? dt : res);
    p->ldd = p->N;
    if (p->K == 0) {
        if (!p->c && !p->bias) {
            st = gm_zero(op, p->dev, p->d, (size_t)(p->M * p->N) * cu_gemm_es(p->d_dt));
            goto convert;
        }
        if ((st = gm_zero_k(p, &s, op))) goto done;
    }
    if ((st = cu_gemm_run(op, p))) goto done;
convert:
    if (!st && dt) st = cu_copy_convert(c, res, dt, false);
done:
    cu_gemm_scratch_free(&s);
    lpx_tensor_release(dt);
    if (st) {
        lpx_tensor_release(res);
        return st;
    }
    cu_ret(c, res);
    return LPX_OK;
}

/* linear's and addmm's contracts are the dispatcher's (spec families
 * `linear`, `addmm`, op_args_nn.h): the tensors are dense, on one device,
 * of float dtypes, of the shapes the geometry describes (read in place
 * from the frame). */
static lpx_status k_linear(lpx_call *c)
{
    const lpx_linear_args *m = (const lpx_linear_args *)lpx_op_args_of(c);
    lpx_tensor *x = m->x, *w = m->w, *bias = m->bias;
    const lpx_gemm_geom *g = &m->g;
    const char *op = cu_op(c);
    lpx_status st;
    int xnd = lpx_tensor_ndim(x);
    int64_t in = g->K, nout = g->N;
    lpx_device dev = lpx_tensor_device(x);
    if ((st = cu_use(op, dev))) return st;
    lpx_dtype R = lpx_tensor_dtype(x);
    lpx_dtype T = R == lpx_tensor_dtype(w) && cu_gemm_hp(R) ? R : LPX_F32;
    int64_t M = g->M;
    const int64_t *oshape = g->out_shape;
    gm_operand ox = {0}, ow = {0};
    lpx_tensor *wt = NULL, *bown = NULL;
    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = dev.index;
    p.M = M;
    p.N = nout;
    p.K = in;
    p.batch = 1;
    p.ab_dt = p.b_dt = p.d_dt = T;
    p.alpha = 1.0f;
    if (M > 0 && nout > 0 && in > 0) {
        /* b = w^T [in, out]: w's strides swapped (a transposed view) */
        if ((st = cu_gemm_operand_of(c, x, T, false, M, in, false, &ox))) goto done;
        if ((st = lpx_t(w, &wt))) goto done;
        if ((st = cu_gemm_operand_of(c, wt, T, false, in, nout, true, &ow))) goto done;
        p.a = ox.p;
        p.a_rs = ox.rs;
        p.a_cs = ox.cs;
        p.b = ow.p;
        p.b_rs = ow.rs;
        p.b_cs = ow.cs;
    }
    if (bias && M > 0 && nout > 0) {
        if ((st = cu_gemm_vector(c, bias, T, nout, &bown, &p.bias))) goto done;
        p.bias_dt = T;
    }
    st = gm_finish_2d(c, &p, R, xnd, oshape);
done:
    cu_gemm_operand_release(&ox);
    cu_gemm_operand_release(&ow);
    lpx_tensor_release(wt);
    lpx_tensor_release(bown);
    return st;
}

static lpx_status k_addmm(lpx_call *c)
{
    const lpx_addmm_args *m = (const lpx_addmm_args *)lpx_op_args_of(c);
    lpx_tensor *ct = m->c, *a = m->a, *b = m->b;
    double beta = m->beta, alpha = m->alpha;
    const char *op = cu_op(c);
    lpx_status st;
    int64_t M = m->g.M, K = m->g.K, N = m->g.N;
    int cnd = lpx_tensor_ndim(ct);
    const int64_t *cs = lpx_tensor_shape(ct);
    int64_t mn[2] = {M, N};
    lpx_device dev = lpx_tensor_device(a);
    if ((st = cu_use(op, dev))) return st;
    lpx_dtype R = lpx_tensor_dtype(a);
    lpx_dtype T = R == lpx_tensor_dtype(b) && cu_gemm_hp(R) ? R : LPX_F32;
    gm_operand oa = {0}, ob = {0};
    lpx_tensor *cown = NULL;
    gm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = dev.index;
    p.M = M;
    p.N = N;
    p.K = K;
    p.batch = 1;
    p.ab_dt = p.b_dt = p.d_dt = T;
    p.alpha = (float)alpha;
    if (M > 0 && N > 0 && K > 0) {
        if ((st = cu_gemm_operand_of(c, a, T, true, M, K, false, &oa)) || (st = cu_gemm_operand_of(c, b, T, true, K, N, true, &ob)))
            goto done;
        p.a = oa.p;
        p.a_rs = oa.rs;
        p.a_cs = oa.cs;
        p.b = ob.p;
        p.b_rs = ob.rs;
        p.b_cs = ob.cs;
    }
    if (beta != 0.0 && M > 0 && N > 0) {
        const int64_t *cst = lpx_tensor_strides(ct);
        bool row_vec = cnd >= 1 && cs[cnd - 1] == N && lpx_tensor_numel(ct) == N;
        if ((float)beta == 1.0f && row_vec) {
            /* c is one row broadcast down: cuBLASLt's bias vector */
            if ((st = cu_gemm_vector(c, ct, T, N, &cown, &p.bias))) goto done;
            p.bias_dt = T;
        } else {
            bool full = cnd == 2 && cs[0] == M && cs[1] == N && lpx_tensor_dtype(ct) == T &&
                        (N <= 1 || cst[1] == 1) && (M <= 1 || cst[0] == N);
            if (full) {
                p.c = lpx_tensor_data(ct);
            } else {
                if ((st = gm_copy_as(c, ct, T, 2, mn, &cown))) goto done;
                p.c = lpx_tensor_data(cown);
            }
            p.ldc = N;
            p.beta = (float)beta;
        }
    }
    st = gm_finish_2d(c, &p, R, 2, mn);
done:
    cu_gemm_operand_release(&oa);
    cu_gemm_operand_release(&ob);
    lpx_tensor_release(cown);
    return st;
}

lpx_status cu_gemm_register_dense(const lpx_host *h)
{
    lpx_status st;
    if ((st = cu_reg(h, LPX_OP_matmul, k_matmul)) || (st = cu_reg(h, LPX_OP_linear, k_linear)) ||
        (st = cu_reg(h, LPX_OP_addmm, k_addmm)))
        return st;
    return LPX_OK;
}
