/* The sharding engine's low-precision optimizer state (issue 37): a group
 * with 8-bit, 4-bit or fp8 moments and an f32 or bf16-sr master steps
 * exactly as the unsharded lpx_optim_adamw_ on the whole parameter (world
 * sizes 1..4, shapes that are not multiples of the block), no block
 * straddles two ranks, the bytes per parameter measured on the shards, and
 * bad options refused. */
#include "fsdp_util.h"
#include "lpx/optim_state.h"
#include "lpx/checkpoint.h"
#include "core/numerics/optim_state.h"

#define NP 3
#define STEPS 3
#define BLOCK 16

static const int64_t s0[2] = {37, 6}, s1[1] = {300}, s2[2] = {9, 16};
static const int64_t *const shp[NP] = {s0, s1, s2};
static const int nd[NP] = {2, 1, 2};

typedef struct eq_ctx {
    lpx_fsdp_state state;
    lpx_fsdp_master master;
    lpx_tensor *full[NP];   /* initial params (f32) */
    lpx_tensor *grad[NP];   /* grads: k / 64, exact in any average of 1..4 copies */
    lpx_tensor *ref[NP];    /* unsharded reference after STEPS steps */
    lpx_tensor *rm[NP], *rv[NP];
    lpx_tensor *rs[NP];     /* scaled-f16 master: the reference's block scales */
    const char *save_dir;   /* eq_rank saves there after its steps */
    lpx_fsdp_state load_state; /* ck_rank: the loading engine's state */
} eq_ctx;

static const lpx_optim_state_format fmt_of[] = {0, LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_FP8};

static bool scaled(lpx_fsdp_master m) { return m == LPX_FSDP_MASTER_F16S || m == LPX_FSDP_MASTER_F16S_SR; }

/* the scaled-f16 master of a whole f32 param: f16 codes and a scale per
 * BLOCK of its flat index (lpx_os_quant_f16s, as the engine at shard) */
static void f16s_of(lpx_tensor *x, int ndim, const int64_t *shape, lpx_tensor **codes, lpx_tensor **scale)
{
    int64_t n = lpx_tensor_numel(x), nb = (n + BLOCK - 1) / BLOCK;
    CHECK_OK(lpx_empty(ndim, shape, LPX_F16, lpx_cpu(), codes));
    CHECK_OK(lpx_empty(1, &nb, LPX_F32, lpx_cpu(), scale));
    const float *xv = lpx_tensor_data(x);
    for (int64_t b = 0; b < nb; b++)
        ((float *)lpx_tensor_data(*scale))[b] = lpx_os_quant_f16s(xv + b * BLOCK, (int)(n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK),
                                                                  (uint16_t *)lpx_tensor_data(*codes) + b * BLOCK);
}

/* the engine's master scales of param i equal the reference's blocks
 * [e0 / BLOCK, ...) */
static bool scale_slice_equal(lpx_fsdp_group *g, int i, lpx_tensor *whole, int64_t e0, int64_t n)
{
    lpx_tensor *s = NULL;
    if (lpx_fsdp_param_master_scale(g, i, &s) || !s) return false;
    bool ok = lpx_tensor_numel(s) == (n + BLOCK - 1) / BLOCK &&
              (!n || !memcmp(lpx_tensor_data(s), (float *)lpx_tensor_data(whole) + e0 / BLOCK, (size_t)lpx_tensor_numel(s) * 4));
    lpx_tensor_release(s);
    return ok;
}

static lpx_adamw_opts hyper(void)
{
    lpx_adamw_opts o = lpx_adamw_opts_default();
    o.lr = 0.01;
    return o;
}

/* the reference: lpx_optim_adamw_ on each whole parameter, rank = its
 * number in the engine, index0 = 0 */
static void make_ref(eq_ctx *c)
{
    lpx_adamw_opts h = hyper();
    for (int i = 0; i < NP; i++) {
        lpx_tensor *p = NULL;
        if (scaled(c->master)) f16s_of(c->full[i], nd[i], shp[i], &p, &c->rs[i]);
        else CHECK_OK(lpx_cast(c->full[i], c->master == LPX_FSDP_MASTER_BF16_SR ? LPX_BF16 : LPX_F32, false, &p));
        CHECK_OK(lpx_optim_state_new(fmt_of[c->state], LPX_OPTIM_STATE_M, nd[i], shp[i], BLOCK, lpx_cpu(), &c->rm[i]));
        CHECK_OK(lpx_optim_state_new(fmt_of[c->state], LPX_OPTIM_STATE_V, nd[i], shp[i], BLOCK, lpx_cpu(), &c->rv[i]));
        lpx_optim_adamw_opts o = lpx_optim_adamw_opts_default();
        o.lr = h.lr, o.beta1 = h.beta1, o.beta2 = h.beta2, o.eps = h.eps, o.weight_decay = h.weight_decay;
        o.master = c->master == LPX_FSDP_MASTER_BF16_SR ? LPX_OPTIM_MASTER_BF16_SR
                   : c->master == LPX_FSDP_MASTER_F16S    ? LPX_OPTIM_MASTER_F16S
                   : c->master == LPX_FSDP_MASTER_F16S_SR ? LPX_OPTIM_MASTER_F16S_SR
                                                          : LPX_OPTIM_MASTER_PLAIN;
        o.seed = 1234;
        o.rank = (uint32_t)i;
        o.index0 = 0;
        for (int t = 1; t <= STEPS; t++)
            CHECK_OK(lpx_optim_adamw_(&p, &c->grad[i], &c->rm[i], &c->rv[i], scaled(c->master) ? &c->rs[i] : NULL, 1, &o, t));
        c->ref[i] = p;
    }
}

/* the slice of a state's inner tensor k holding elements [e0, e0 + n) */
static bool state_slice_equal(lpx_tensor *shard, lpx_tensor *whole, int64_t e0, int64_t n, int64_t block, bool four)
{
    lpx_tensor *cs = lpx_tensor_inner(shard, 0), *cw = lpx_tensor_inner(whole, 0);
    lpx_tensor *ss = lpx_tensor_inner(shard, 1), *sw = lpx_tensor_inner(whole, 1);
    size_t es = (size_t)lpx_dtype_nbytes(lpx_tensor_dtype(cw), 1);
    int64_t c0 = four ? e0 / 2 : e0, cn = lpx_tensor_numel(cs);
    if (lpx_tensor_numel(ss) != (n + block - 1) / block) return false;
    if (cn && memcmp((char *)lpx_tensor_data(cs), (char *)lpx_tensor_data(cw) + (size_t)c0 * es, (size_t)cn * es)) return false;
    return !n || !memcmp(lpx_tensor_data(ss), (float *)lpx_tensor_data(sw) + e0 / block, (size_t)lpx_tensor_numel(ss) * 4);
}

static lpx_status eq_rank(lpx_comm *comm, void *vctx)
{
    eq_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
    lpx_fsdp_optim o = {sizeof o, c->state, BLOCK, c->master, 1234};
    RCHECK_OK(r, lpx_fsdp_group_set_optim(g, &o));
    for (int i = 0; i < NP; i++) RCHECK_OK(r, lpx_fsdp_param_add(g, "p", c->full[i], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_adamw_opts h = hyper();
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < NP; i++) RCHECK_OK(r, lpx_fsdp_set_grad(g, i, c->grad[i]));
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
        RCHECK_OK(r, lpx_fsdp_adamw_step(g, &h));
    }
    for (int i = 0; i < NP; i++) {
        int64_t start, len, unit, row = 1;
        RCHECK_OK(r, lpx_fsdp_param_rows(g, i, &start, &len, &unit));
        for (int d = 1; d < nd[i]; d++) row *= shp[i][d];
        /* no block straddles two ranks: every shard starts on a block */
        if (len && (start * row) % BLOCK) rfail(r, "param %d: shard starts at element %lld, inside a block", i, (long long)(start * row));
        lpx_tensor *loc = lpx_fsdp_param_local(g, i), *rows = NULL, *m = NULL, *v = NULL;
        RCHECK(r, lpx_tensor_dtype(loc) == (c->master == LPX_FSDP_MASTER_BF16_SR ? LPX_BF16
                                            : scaled(c->master)                  ? LPX_F16
                                                                                 : LPX_F32));
        RCHECK_OK(r, lpx_narrow(c->ref[i], 0, start, len, &rows));
        if (!same_bits(loc, rows)) rfail(r, "state %d master %d param %d: shard != unsharded lpx_optim_adamw_", c->state, c->master, i);
        if (scaled(c->master) && !scale_slice_equal(g, i, c->rs[i], start * row, len * row))
            rfail(r, "state %d master %d param %d: master scales != the unsharded ones", c->state, c->master, i);
        int64_t step = 0;
        RCHECK_OK(r, lpx_fsdp_param_optim_state(g, i, &m, &v, &step));
        RCHECK(r, step == STEPS && m && v);
        bool four = c->state == LPX_FSDP_STATE_4BIT;
        if (m && !state_slice_equal(m, c->rm[i], start * row, len * row, BLOCK, four))
            rfail(r, "state %d param %d: m codes/scales != the unsharded state's slice", c->state, i);
        if (v && !state_slice_equal(v, c->rv[i], start * row, len * row, BLOCK, four))
            rfail(r, "state %d param %d: v codes/scales != the unsharded state's slice", c->state, i);
        lpx_tensor_release(rows);
        lpx_tensor_release(m);
        lpx_tensor_release(v);
    }
    if (c->save_dir) {
        RCHECK_OK(r, lpx_fsdp_save(f, c->save_dir));
        /* the consolidated export with the moments: dequantized f32 at the
         * parameter's global shape, equal to the unsharded state's */
        char path[600];
        snprintf(path, sizeof path, "%s.export.safetensors", c->save_dir);
        RCHECK(r, lpx_fsdp_export_ex(f, path, LPX_F32, NULL, NULL, 0, NULL, 8u) == LPX_EINVAL);
        RCHECK_OK(r, lpx_fsdp_export_ex(f, path, LPX_F32, NULL, NULL, 0, NULL, LPX_FSDP_EXPORT_OPTIM_STATE));
        lpx_safetensors *sf = NULL;
        RCHECK_OK(r, lpx_safetensors_open(path, &sf));
        RCHECK(r, sf && lpx_safetensors_count(sf) == 3 * NP);
        for (int i = 0; sf && i < NP; i++) {
            lpx_tensor *ref[2] = {c->rm[i], c->rv[i]};
            for (int k = 0; k < 2; k++) {
                char nm[600];
                lpx_tensor *t = NULL, *d = NULL;
                snprintf(nm, sizeof nm, "%s%s", lpx_safetensors_name(sf, 3 * i), k ? ".exp_avg_sq" : ".exp_avg");
                RCHECK_OK(r, lpx_safetensors_get(sf, nm, &t));
                RCHECK_OK(r, lpx_kind_to_dense(ref[k], &d));
                if (!same_bits(t, d)) rfail(r, "export: %s != the unsharded state dequantized", nm);
                lpx_tensor_release(t);
                lpx_tensor_release(d);
            }
        }
        lpx_safetensors_close(sf);
    }
    lpx_fsdp_free(f);
    return LPX_OK;
}

/* loads c->save_dir into an engine of c->load_state: params bit for bit;
 * the same format: codes and scales equal the unsharded state's slices
 * (blocks moved whole); f32 moments: the unsharded state dequantized, bit
 * for bit; another format: requantized, within its quantization error */
static lpx_status ck_rank(lpx_comm *comm, void *vctx)
{
    eq_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
    lpx_fsdp_optim o = {sizeof o, c->load_state, BLOCK, c->master, 1234};
    RCHECK_OK(r, lpx_fsdp_group_set_optim(g, &o));
    for (int i = 0; i < NP; i++) RCHECK_OK(r, lpx_fsdp_param_add(g, "p", c->full[i], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    RCHECK_OK(r, lpx_fsdp_load(f, c->save_dir));
    for (int i = 0; i < NP; i++) {
        int64_t start, len, row = 1, step = 0;
        RCHECK_OK(r, lpx_fsdp_param_rows(g, i, &start, &len, NULL));
        for (int d = 1; d < nd[i]; d++) row *= shp[i][d];
        lpx_tensor *rows = NULL, *m = NULL, *v = NULL;
        RCHECK_OK(r, lpx_narrow(c->ref[i], 0, start, len, &rows));
        if (!same_bits(lpx_fsdp_param_local(g, i), rows)) rfail(r, "param %d: loaded shard != saved", i);
        if (scaled(c->master) && !scale_slice_equal(g, i, c->rs[i], start * row, len * row))
            rfail(r, "param %d: loaded master scales != saved", i);
        lpx_tensor_release(rows);
        if (c->load_state == c->state) {
            RCHECK_OK(r, lpx_fsdp_param_optim_state(g, i, &m, &v, &step));
            bool four = c->state == LPX_FSDP_STATE_4BIT;
            if (!m || !state_slice_equal(m, c->rm[i], start * row, len * row, BLOCK, four) ||
                !state_slice_equal(v, c->rv[i], start * row, len * row, BLOCK, four))
                rfail(r, "param %d: loaded state != the saved blocks", i);
        } else {
            RCHECK_OK(r, lpx_fsdp_param_adamw_state(g, i, &m, &v, &step));
            lpx_tensor *ref[2] = {c->rm[i], c->rv[i]}, *got[2] = {m, v};
            for (int k = 0; k < 2; k++) {
                lpx_tensor *d = NULL, *fl = NULL, *sl = NULL, *gf = NULL;
                int64_t all = -1;
                RCHECK_OK(r, lpx_kind_to_dense(ref[k], &d));
                RCHECK_OK(r, lpx_reshape(d, 1, &all, &fl));
                RCHECK_OK(r, lpx_narrow(fl, 0, start * row, len * row, &sl));
                RCHECK_OK(r, lpx_reshape(got[k], 1, &all, &gf));
                if (c->load_state == LPX_FSDP_STATE_F32) {
                    if (!same_bits(sl, gf)) rfail(r, "param %d: f32 moment %d != the saved state dequantized", i, k);
                } else {
                    double amax = 0, err = len ? max_abs_diff(sl, gf) : 0;
                    const float *x = lpx_tensor_data(sl);
                    for (int64_t e = 0; e < len * row; e++) amax = fabs(x[e]) > amax ? fabs(x[e]) : amax;
                    /* requantized into another format: its block error
                     * (4-bit: half the widest step of the map, <= 0.25 absmax) */
                    if (err > 0.25 * amax + 1e-30) rfail(r, "param %d moment %d: requantized error %g, absmax %g", i, k, err, amax);
                }
                lpx_tensor_release(d);
                lpx_tensor_release(fl);
                lpx_tensor_release(sl);
                lpx_tensor_release(gf);
            }
        }
        RCHECK(r, step == STEPS);
        lpx_tensor_release(m);
        lpx_tensor_release(v);
    }
    lpx_fsdp_free(f);
    return LPX_OK;
}

/* f32 moments with a bf16-sr master: the engine's own f32 loop (the fsdp.h
 * arithmetic) and then the stochastic rounding keyed by (seed, param
 * number, step, global index): equal to that on the whole param */
static void sr_ref(eq_ctx *c)
{
    lpx_adamw_opts o = hyper();
    for (int i = 0; i < NP; i++) {
        size_t n = (size_t)lpx_tensor_numel(c->full[i]);
        lpx_tensor *pb = NULL;
        if (scaled(c->master)) f16s_of(c->full[i], nd[i], shp[i], &pb, &c->rs[i]);
        else CHECK_OK(lpx_cast(c->full[i], LPX_BF16, false, &pb));
        float *x = calloc(n, 4), *m = calloc(n, 4), *v = calloc(n, 4);
        const float *g = lpx_tensor_data(c->grad[i]);
        for (int t = 1; t <= STEPS; t++) {
            if (scaled(c->master))
                for (size_t b = 0; b < n; b += BLOCK)
                    lpx_os_dequant_f16s((uint16_t *)lpx_tensor_data(pb) + b, ((float *)lpx_tensor_data(c->rs[i]))[b / BLOCK],
                                        (int)(n - b < BLOCK ? n - b : BLOCK), x + b);
            else lpx_convert(x, LPX_F32, lpx_tensor_data(pb), LPX_BF16, n, 0);
            const float b1 = (float)o.beta1, b2 = (float)o.beta2, omb1 = (float)(1.0 - o.beta1),
                        omb2 = (float)(1.0 - o.beta2), lr = (float)o.lr, eps = (float)o.eps,
                        decay = (float)(1.0 - o.lr * o.weight_decay), bc1 = (float)(1.0 - pow(o.beta1, (double)t)),
                        bc2 = (float)(1.0 - pow(o.beta2, (double)t));
            for (size_t k = 0; k < n; k++) {
                m[k] = b1 * m[k] + omb1 * g[k];
                v[k] = b2 * v[k] + omb2 * g[k] * g[k];
                float mh = m[k] / bc1, vh = v[k] / bc2;
                x[k] = x[k] * decay - lr * mh / (sqrtf(vh) + eps);
            }
            if (scaled(c->master))
                for (size_t b = 0; b < n; b += BLOCK)
                    ((float *)lpx_tensor_data(c->rs[i]))[b / BLOCK] =
                        lpx_os_f16s_store(x + b, (int)(n - b < BLOCK ? n - b : BLOCK), (uint16_t *)lpx_tensor_data(pb) + b,
                                          c->master == LPX_FSDP_MASTER_F16S_SR, 1234, (uint32_t)i, (uint64_t)t, b);
            else lpx_os_bf16_sr_store(x, (int)n, lpx_tensor_data(pb), 1234, (uint32_t)i, (uint64_t)t, 0);
        }
        c->ref[i] = pb;
        free(x);
        free(m);
        free(v);
    }
}

static lpx_status sr_rank(lpx_comm *comm, void *vctx)
{
    eq_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
    lpx_fsdp_optim o = {sizeof o, LPX_FSDP_STATE_F32, scaled(c->master) ? BLOCK : 0, c->master, 1234};
    RCHECK_OK(r, lpx_fsdp_group_set_optim(g, &o));
    for (int i = 0; i < NP; i++) RCHECK_OK(r, lpx_fsdp_param_add(g, "p", c->full[i], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_adamw_opts h = hyper();
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < NP; i++) RCHECK_OK(r, lpx_fsdp_set_grad(g, i, c->grad[i]));
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
        RCHECK_OK(r, lpx_fsdp_adamw_step(g, &h));
    }
    for (int i = 0; i < NP; i++) {
        int64_t start, len;
        lpx_tensor *rows = NULL;
        RCHECK_OK(r, lpx_fsdp_param_rows(g, i, &start, &len, NULL));
        RCHECK_OK(r, lpx_narrow(c->ref[i], 0, start, len, &rows));
        if (!same_bits(lpx_fsdp_param_local(g, i), rows)) rfail(r, "f32 moments, master %d: param %d != the reference", c->master, i);
        int64_t row = 1;
        for (int d = 1; d < nd[i]; d++) row *= shp[i][d];
        if (scaled(c->master) && !scale_slice_equal(g, i, c->rs[i], start * row, len * row))
            rfail(r, "f32 moments, master %d: param %d's scales != the reference", c->master, i);
        lpx_tensor_release(rows);
    }
    int64_t sb = 0, mb = 0, np = 0, nbl = 0;
    RCHECK_OK(r, lpx_fsdp_optim_bytes(f, &sb, &mb, &np));
    for (int i = 0; i < NP && scaled(c->master); i++) {
        lpx_tensor *sc = NULL;
        RCHECK_OK(r, lpx_fsdp_param_master_scale(g, i, &sc));
        nbl += sc ? lpx_tensor_numel(sc) : 0;
        lpx_tensor_release(sc);
    }
    RCHECK(r, sb == 8 * np && mb == 2 * np + 4 * nbl);
    lpx_fsdp_free(f);
    return LPX_OK;
}

static void f32_moments_master(lpx_fsdp_master master)
{
    eq_ctx c;
    memset(&c, 0, sizeof c);
    c.master = master;
    for (int i = 0; i < NP; i++) {
        c.full[i] = rand_normal(nd[i], shp[i], 700 + (uint64_t)i, 1.0, LPX_F32);
        lpx_tensor *gn = rand_normal(nd[i], shp[i], 800 + (uint64_t)i, 64.0, LPX_F32);
        float *gv = lpx_tensor_data(gn);
        for (int64_t k = 0; k < lpx_tensor_numel(gn); k++) gv[k] = roundf(gv[k]) / 64.0f;
        c.grad[i] = gn;
    }
    sr_ref(&c);
    for (int w = 1; w <= 4; w++) run_ranks(w, sr_rank, &c);
    for (int i = 0; i < NP; i++) {
        lpx_tensor_release(c.full[i]);
        lpx_tensor_release(c.grad[i]);
        lpx_tensor_release(c.ref[i]);
        lpx_tensor_release(c.rs[i]);
    }
}

static void test_f32_moments_bf16_sr(void) { f32_moments_master(LPX_FSDP_MASTER_BF16_SR); }
/* the same with FP8-LM's scaled f16 master (RNE and stochastic): codes
 * and scales per block of the global index */
static void test_f32_moments_f16_scaled(void)
{
    f32_moments_master(LPX_FSDP_MASTER_F16S);
    f32_moments_master(LPX_FSDP_MASTER_F16S_SR);
}

static void test_equals_unsharded(void)
{
    for (int s = LPX_FSDP_STATE_8BIT; s <= LPX_FSDP_STATE_FP8; s++)
        for (int m = 0; m < 4; m++) {
            eq_ctx c;
            memset(&c, 0, sizeof c);
            c.state = (lpx_fsdp_state)s;
            c.master = (lpx_fsdp_master)m;
            for (int i = 0; i < NP; i++) {
                c.full[i] = rand_normal(nd[i], shp[i], 500 + (uint64_t)i, 1.0, LPX_F32);
                lpx_tensor *gn = rand_normal(nd[i], shp[i], 600 + (uint64_t)i, 64.0, LPX_F32);
                float *gv = lpx_tensor_data(gn);
                for (int64_t k = 0; k < lpx_tensor_numel(gn); k++) gv[k] = roundf(gv[k]) / 64.0f;
                c.grad[i] = gn;
            }
            make_ref(&c);
            for (int w = 1; w <= 4; w++) run_ranks(w, eq_rank, &c);
            /* checkpoint at world 4, load at 4, 3, 2 and 1 (blocks move
             * whole), into f32 moments (dequantized), and into another
             * format (requantized) */
            char dir[] = "/tmp/lpx-fsdp-optim-XXXXXX", ck[64];
            CHECK(mkdtemp(dir) != NULL);
            snprintf(ck, sizeof ck, "%s/ck", dir);
            c.save_dir = ck;
            run_ranks(4, eq_rank, &c);
            c.load_state = c.state;
            for (int w = 4; w >= 1; w--) run_ranks(w, ck_rank, &c);
            c.load_state = LPX_FSDP_STATE_F32;
            if (m == 0) run_ranks(3, ck_rank, &c);
            c.load_state = c.state == LPX_FSDP_STATE_8BIT ? LPX_FSDP_STATE_FP8 : LPX_FSDP_STATE_8BIT;
            if (m == 0) run_ranks(2, ck_rank, &c);
            c.save_dir = NULL;
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            CHECK(system(cmd) == 0);
            for (int i = 0; i < NP; i++) {
                lpx_tensor_release(c.full[i]);
                lpx_tensor_release(c.grad[i]);
                lpx_tensor_release(c.ref[i]);
                lpx_tensor_release(c.rm[i]);
                lpx_tensor_release(c.rv[i]);
                lpx_tensor_release(c.rs[i]);
                c.rs[i] = NULL;
            }
        }
}

/* bytes per parameter on the shards of a [512, 64] param (world 1, the
 * formats' default block) */
static lpx_status bytes_rank(lpx_comm *comm, void *vctx)
{
    double *out = vctx;
    int r = lpx_comm_rank(comm);
    const int64_t s[2] = {512, 64};
    lpx_tensor *full = rand_normal(2, s, 9, 1.0, LPX_F32);
    for (int k = 0; k < 5; k++) {
        lpx_fsdp *f = NULL;
        lpx_status st = new_engine(comm, NULL, &f);
        if (st) return st;
        lpx_fsdp_group *g = NULL;
        RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
        lpx_fsdp_optim o = {sizeof o, k < 4 ? (lpx_fsdp_state)k : LPX_FSDP_STATE_8BIT, 0,
                            k < 4 ? LPX_FSDP_MASTER_F32 : LPX_FSDP_MASTER_BF16_SR, 1};
        RCHECK_OK(r, lpx_fsdp_group_set_optim(g, &o));
        RCHECK_OK(r, lpx_fsdp_param_add(g, "w", full, 0, NULL));
        RCHECK_OK(r, lpx_fsdp_shard(f));
        RCHECK_OK(r, lpx_fsdp_set_grad(g, 0, full));
        RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
        RCHECK_OK(r, lpx_fsdp_adamw_step(g, NULL));
        int64_t sb = 0, mb = 0, np = 0;
        RCHECK_OK(r, lpx_fsdp_optim_bytes(f, &sb, &mb, &np));
        out[2 * k] = (double)sb / (double)np;
        out[2 * k + 1] = (double)mb / (double)np;
        lpx_fsdp_free(f);
    }
    lpx_tensor_release(full);
    return LPX_OK;
}

static void test_bytes_per_param(void)
{
    double b[10] = {0};
    run_ranks(1, bytes_rank, b);
    printf("# bytes/param state (master): f32 %.4f (%.2f), 8bit %.4f (%.2f), 4bit %.4f (%.2f), fp8 %.4f (%.2f), "
           "8bit+bf16-sr %.4f (%.2f)\n", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]);
    CHECK(b[0] == 8.0 && b[1] == 4.0);
    CHECK(b[2] <= 2.05 && b[4] <= 1.05 && b[6] <= 3.05);
    CHECK(b[9] == 2.0);
}

static lpx_status bad_rank(lpx_comm *comm, void *vctx)
{
    (void)vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, NULL, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "g", &g));
    lpx_fsdp_optim o = {sizeof o, (lpx_fsdp_state)7, 0, LPX_FSDP_MASTER_F32, 0};
    RCHECK(r, lpx_fsdp_group_set_optim(g, &o) == LPX_EINVAL && strstr(lpx_last_error(), "optim.state 7"));
    o.state = LPX_FSDP_STATE_8BIT;
    o.master = (lpx_fsdp_master)5;
    RCHECK(r, lpx_fsdp_group_set_optim(g, &o) == LPX_EINVAL && strstr(lpx_last_error(), "optim.master 5"));
    o.master = LPX_FSDP_MASTER_F32;
    o.block = 24;
    RCHECK(r, lpx_fsdp_group_set_optim(g, &o) == LPX_EINVAL && strstr(lpx_last_error(), "optim.block 24"));
    o.block = 512;
    RCHECK(r, lpx_fsdp_group_set_optim(g, &o) == LPX_EINVAL && strstr(lpx_last_error(), "optim.block 512"));
    RCHECK(r, !strchr(lpx_last_error(), '\n'));
    o.block = 0;
    RCHECK_OK(r, lpx_fsdp_group_set_optim(g, &o));
    lpx_fsdp_optim got;
    RCHECK_OK(r, lpx_fsdp_group_get_optim(g, &got));
    RCHECK(r, got.state == LPX_FSDP_STATE_8BIT && got.block == 256);
    const int64_t s[1] = {10};
    lpx_tensor *p = rand_normal(1, s, 3, 1.0, LPX_F32);
    RCHECK_OK(r, lpx_fsdp_param_add(g, "p", p, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    RCHECK(r, lpx_fsdp_group_set_optim(g, &o) == LPX_EINVAL && strstr(lpx_last_error(), "after lpx_fsdp_shard"));
    lpx_tensor *m = NULL, *v = NULL;
    RCHECK(r, lpx_fsdp_param_adamw_view(g, 0, &m, &v, NULL) == LPX_EINVAL);
    /* a state of another format is refused */
    RCHECK_OK(r, lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_M, 1, s, 256, lpx_cpu(), &m));
    RCHECK_OK(r, lpx_optim_state_new(LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_V, 1, s, 256, lpx_cpu(), &v));
    if (r == 0) RCHECK(r, lpx_fsdp_param_set_optim_state(g, 0, m, v, 1) == LPX_EINVAL && strstr(lpx_last_error(), "state kind"));
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    lpx_tensor_release(p);
    lpx_fsdp_free(f);
    return LPX_OK;
}

static void test_bad_options(void) { run_ranks(2, bad_rank, NULL); }

int main(void)
{
    RUN(test_bad_options);
    RUN(test_bytes_per_param);
    RUN(test_equals_unsharded);
    RUN(test_f32_moments_bf16_sr);
    RUN(test_f32_moments_f16_scaled);
    return CHECK_DONE();
}
