/* Gradient codecs (include/lpx/fsdp.h, "gradient codecs"): the registry,
 * the built-ins' names, config mapping (grad_codec, fp8_grad_reduce), and
 * a codec registered here that copies bytes and counts its calls: the
 * engine must run its reduce-scatter through it (prepare once per bucket,
 * encode once per param and rank with rows, decode once per param, finish
 * once) and give the same bits as "plain". */
#include <stdatomic.h>
#include "fsdp_util.h"

static atomic_int n_configure, n_release, n_prepare, n_encode, n_decode, n_finish;
static int tag = 42; /* the registrant's user pointer must reach the functions */

static lpx_status cc_configure(const lpx_grad_codec_i *self, const lpx_fsdp_config *cfg, void **state)
{
    (void)cfg;
    if (self->user != &tag) return lpx_error(LPX_EINVAL, "user pointer lost");
    atomic_fetch_add(&n_configure, 1);
    *state = &tag;
    return LPX_OK;
}

static void cc_release(const lpx_grad_codec_i *self, void *state)
{
    (void)self;
    if (state == &tag) atomic_fetch_add(&n_release, 1);
}

/* every dtype one bucket per dtype, as it is, averaged */
static lpx_status cc_wire(const lpx_grad_codec_i *self, void *state, lpx_dtype grad, lpx_grad_wire *out)
{
    (void)self;
    (void)state;
    if (grad != LPX_F32 && grad != LPX_BF16) return lpx_error(LPX_EDTYPE, "counting codec: f32 or bf16 only");
    out->bucket = grad == LPX_F32 ? 0 : 1;
    out->wire = out->out = grad;
    out->op = LPX_REDUCE_AVG;
    return LPX_OK;
}

static lpx_status cc_prepare(const lpx_grad_codec_i *self, void *state, lpx_grad_codec_ctx *ctx)
{
    (void)self;
    if (state != &tag || ctx->ngrads < 1 || !ctx->comm || ctx->world != lpx_comm_size(ctx->comm))
        return lpx_error(LPX_EINVAL, "counting codec: bad context");
    atomic_fetch_add(&n_prepare, 1);
    ctx->call = &n_prepare;
    return LPX_OK;
}

static lpx_status cc_encode(const lpx_grad_codec_i *self, void *state, const lpx_grad_codec_ctx *ctx, const void *src,
                            lpx_dtype grad, void *dst, size_t n)
{
    (void)self;
    (void)state;
    if (ctx->call != &n_prepare || grad != ctx->wire.wire) return lpx_error(LPX_EINVAL, "counting codec: no prepare");
    atomic_fetch_add(&n_encode, 1);
    memcpy(dst, src, lpx_dtype_nbytes(grad, (int64_t)n));
    return LPX_OK;
}

static lpx_status cc_decode(const lpx_grad_codec_i *self, void *state, const lpx_grad_codec_ctx *ctx, const void *src,
                            void *dst, size_t n)
{
    (void)self;
    (void)state;
    atomic_fetch_add(&n_decode, 1);
    memcpy(dst, src, lpx_dtype_nbytes(ctx->wire.out, (int64_t)n));
    return LPX_OK;
}

static void cc_finish(const lpx_grad_codec_i *self, void *state, lpx_grad_codec_ctx *ctx)
{
    (void)self;
    (void)state;
    if (ctx->call == &n_prepare) atomic_fetch_add(&n_finish, 1);
}

static const lpx_grad_codec_i counting = {
    .struct_size = sizeof(lpx_grad_codec_i),
    .name = "counting",
    .description = "copies, counts its calls (tests/test_fsdp_codec.c)",
    .configure = cc_configure,
    .release = cc_release,
    .wire = cc_wire,
    .prepare = cc_prepare,
    .encode = cc_encode,
    .decode = cc_decode,
    .finish = cc_finish,
    .user = &tag,
};

#define W 2
typedef struct codec_ctx {
    const char *codec;
    lpx_tensor *params[2], *grads[W][2];
    lpx_tensor *got[W][2];
    uint64_t rs_calls[W];
} codec_ctx;

static lpx_status codec_rank(lpx_comm *comm, void *vctx)
{
    codec_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .grad_codec = c->codec};
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    RCHECK(r, !strcmp(lpx_fsdp_grad_codec(f), c->codec));
    RCHECK(r, lpx_fsdp_placement_get(f) == LPX_FSDP_HOST);
    lpx_fsdp_group *g = NULL;
    RCHECK_OK(r, lpx_fsdp_group_add(f, "l", &g));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "a", c->params[0], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "b", c->params[1], 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    lpx_fsdp_stats_reset(f);
    for (int i = 0; i < 2; i++) RCHECK_OK(r, lpx_fsdp_set_grad(g, i, c->grads[r][i]));
    RCHECK_OK(r, lpx_fsdp_reduce_scatter_grads(g));
    for (int i = 0; i < 2; i++) {
        c->got[r][i] = lpx_fsdp_param_grad(g, i);
        lpx_tensor_retain(c->got[r][i]);
    }
    lpx_fsdp_stats s = {.struct_size = sizeof s};
    RCHECK_OK(r, lpx_fsdp_stats_get(f, &s));
    c->rs_calls[r] = s.calls[LPX_COLL_REDUCE_SCATTER];
    lpx_fsdp_free(f);
    return LPX_OK;
}

static void run_codec(codec_ctx *c, const char *name)
{
    c->codec = name;
    run_ranks(W, codec_rank, c);
}

static void test_registry(void)
{
    const lpx_grad_codec_i *p = NULL;
    CHECK_OK(lpx_grad_codec_find(LPX_GRAD_CODEC_PLAIN, &p));
    CHECK(p && (p->flags & LPX_GRAD_CODEC_PASSTHROUGH));
    CHECK_OK(lpx_grad_codec_find(LPX_GRAD_CODEC_FP8LM, &p));
    CHECK(p && !(p->flags & LPX_GRAD_CODEC_PASSTHROUGH));
    CHECK_ERR(lpx_grad_codec_find("counting", &p), LPX_ENOTFOUND);
    CHECK(strstr(lpx_last_error(), "plain") && strstr(lpx_last_error(), "fp8lm"));
    lpx_grad_codec_i bad = counting;
    bad.name = LPX_GRAD_CODEC_PLAIN;
    CHECK_ERR(lpx_grad_codec_register(&bad), LPX_EEXIST);
    bad = counting;
    bad.encode = NULL;
    CHECK_ERR(lpx_grad_codec_register(&bad), LPX_EINVAL); /* encodes nothing, not pass-through */
    bad = counting;
    bad.wire = NULL;
    CHECK_ERR(lpx_grad_codec_register(&bad), LPX_EINVAL);
    CHECK_ERR(lpx_grad_codec_unregister(LPX_GRAD_CODEC_FP8LM), LPX_EINVAL);
    CHECK_OK(lpx_grad_codec_register(&counting));
    CHECK_ERR(lpx_grad_codec_register(&counting), LPX_EEXIST);
    CHECK_OK(lpx_grad_codec_find("counting", &p));
    CHECK(p && p->user == &tag && p->name != counting.name); /* the name was copied */
    CHECK_OK(lpx_grad_codec_unregister("counting"));
    CHECK_ERR(lpx_grad_codec_find("counting", &p), LPX_ENOTFOUND);
    CHECK_ERR(lpx_grad_codec_unregister("counting"), LPX_ENOTFOUND);
}

static void test_config(void)
{
    lpx_comm *comms[1];
    CHECK_OK(lpx_local_comm_group_create(1, comms));
    lpx_fsdp *f = NULL;
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg};
    CHECK_OK(new_engine(comms[0], &cfg, &f));
    CHECK(f && !strcmp(lpx_fsdp_grad_codec(f), LPX_GRAD_CODEC_PLAIN));
    lpx_fsdp_free(f);
    f = NULL;
    cfg.fp8_grad_reduce = true; /* the old switch: the FP8-LM codec */
    CHECK_OK(new_engine(comms[0], &cfg, &f));
    CHECK(f && !strcmp(lpx_fsdp_grad_codec(f), LPX_GRAD_CODEC_FP8LM));
    lpx_fsdp_free(f);
    f = NULL;
    cfg.fp8_grad_dtype = LPX_BF16; /* the FP8-LM codec validates its dtype */
    CHECK_ERR(new_engine(comms[0], &cfg, &f), LPX_EDTYPE);
    CHECK(f == NULL && strstr(lpx_last_error(), "fp8_grad_dtype"));
    cfg.fp8_grad_dtype = 0;
    cfg.grad_codec = LPX_GRAD_CODEC_PLAIN; /* a contradiction */
    CHECK_ERR(new_engine(comms[0], &cfg, &f), LPX_EINVAL);
    CHECK(f == NULL);
    cfg.fp8_grad_reduce = false;
    cfg.grad_codec = "no-such-codec";
    CHECK_ERR(new_engine(comms[0], &cfg, &f), LPX_ENOTFOUND);
    CHECK(f == NULL && strstr(lpx_last_error(), "no-such-codec"));
    lpx_comm_caps caps = {.struct_size = sizeof caps};
    CHECK_OK(lpx_comm_caps_get(comms[0], &caps)); /* a host comm: the defaults */
    CHECK(caps.device.type == LPX_DEVICE_CPU && !caps.host_all_gather);
    CHECK_ERR(lpx_comm_all_gather_host(comms[0], NULL, NULL, 0, NULL), LPX_ENOTIMPL);
    CHECK_ERR(lpx_comm_sync_ticket(comms[0], 1), LPX_ENOTIMPL);
    lpx_comm_destroy(comms[0]);
}

static void test_engine_uses_codec(void)
{
    codec_ctx c, ref;
    memset(&c, 0, sizeof c);
    const int64_t sa[2] = {7, 5}, sb[1] = {9};
    c.params[0] = rand_normal(2, sa, 1, 1.0, LPX_F32);
    c.params[1] = rand_normal(1, sb, 2, 1.0, LPX_BF16);
    for (int r = 0; r < W; r++) {
        c.grads[r][0] = rand_normal(2, sa, 10 + (uint64_t)r, 1.0, LPX_F32);
        c.grads[r][1] = rand_normal(1, sb, 20 + (uint64_t)r, 1.0, LPX_BF16);
    }
    ref = c;
    run_codec(&ref, LPX_GRAD_CODEC_PLAIN);
    CHECK(atomic_load(&n_encode) == 0);
    CHECK_OK(lpx_grad_codec_register(&counting));
    run_codec(&c, "counting");
    CHECK_OK(lpx_grad_codec_unregister("counting"));
    /* per rank: configure and release once, two buckets (f32, bf16): two
     * prepares and finishes; encode per param and destination rank (every
     * shard has rows: 7 rows -> 4 + 3, 9 -> 5 + 4), decode per param */
    CHECKF(atomic_load(&n_configure) == W && atomic_load(&n_release) == W, "configure %d release %d",
           atomic_load(&n_configure), atomic_load(&n_release));
    CHECKF(atomic_load(&n_prepare) == 2 * W && atomic_load(&n_finish) == 2 * W, "prepare %d finish %d",
           atomic_load(&n_prepare), atomic_load(&n_finish));
    CHECKF(atomic_load(&n_encode) == 2 * W * W, "encode %d", atomic_load(&n_encode));
    CHECKF(atomic_load(&n_decode) == 2 * W, "decode %d", atomic_load(&n_decode));
    for (int r = 0; r < W; r++) {
        CHECK(c.rs_calls[r] == 2 && ref.rs_calls[r] == 2);
        for (int i = 0; i < 2; i++) {
            CHECK(c.got[r][i] && ref.got[r][i] && same_bits(c.got[r][i], ref.got[r][i]));
            lpx_tensor_release(c.got[r][i]);
            lpx_tensor_release(ref.got[r][i]);
        }
        lpx_tensor_release(c.grads[r][0]);
        lpx_tensor_release(c.grads[r][1]);
    }
    lpx_tensor_release(c.params[0]);
    lpx_tensor_release(c.params[1]);
}

/* a grad dtype the codec refuses is refused at lpx_fsdp_set_grad */
static lpx_status refuse_rank(lpx_comm *comm, void *vctx)
{
    (void)vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp_config cfg = {.struct_size = sizeof cfg, .grad_codec = "counting"};
    lpx_fsdp *f = NULL;
    lpx_status st = new_engine(comm, &cfg, &f);
    if (st) return st;
    lpx_fsdp_group *g = NULL;
    const int64_t s[1] = {4};
    lpx_tensor *p = rand_normal(1, s, 3, 1.0, LPX_F32), *gr = rand_normal(1, s, 4, 1.0, LPX_F16);
    RCHECK_OK(r, lpx_fsdp_group_add(f, "l", &g));
    RCHECK_OK(r, lpx_fsdp_param_add(g, "p", p, 0, NULL));
    RCHECK_OK(r, lpx_fsdp_shard(f));
    RCHECK(r, lpx_fsdp_set_grad(g, 0, gr) == LPX_EDTYPE && strstr(lpx_last_error(), "f32 or bf16 only"));
    lpx_tensor_release(p);
    lpx_tensor_release(gr);
    lpx_fsdp_free(f);
    return LPX_OK;
}

static void test_refused_dtype(void)
{
    CHECK_OK(lpx_grad_codec_register(&counting));
    run_ranks(1, refuse_rank, NULL);
    CHECK_OK(lpx_grad_codec_unregister("counting"));
}

int main(void)
{
    RUN(test_registry);
    RUN(test_config);
    RUN(test_engine_uses_codec);
    RUN(test_refused_dtype);
    return CHECK_DONE();
}
