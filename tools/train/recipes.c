/* One linear layer per recipe: how `out = x @ W^T` and its backward run.
 *
 *   bf16                W gathered in bf16, GEMMs with f32 activations
 *   float8-tensorwise   W gathered in fp8 (float8_weight: e4m3, scale
 *                       precomputed from the global amax), Float8Linear
 *                       tensorwise (e5m2 grads)
 *   float8-rowwise      W gathered in fp8 (rowwise float8_weight: one scale
 *                       per row, no amax all-reduce), Float8Linear rowwise
 *   float8-delayed      W gathered in bf16, Float8Linear delayed scaling
 *   float8-blockwise    W gathered in fp8 (blockwise float8_weight: 128 x 128
 *                       blocks, no amax all-reduce), Float8Linear blockwise
 *                       (1 x 128 blocks for activations and gradients,
 *                       e4m3, power-of-two scales); the gathered weight
 *                       serves fprop and dgrad as it is
 *   nf4-qlora           frozen NF4 W, trainable LoRA adapters A, B
 *   mxfp8 / mxfp4       W gathered in bf16 and quantized to an MX kind of
 *                       the lpx-mx.so plugin for the forward GEMM; the
 *                       backward uses the dense weight (straight-through)
 * A delayed scale changes per cast, so float8-delayed gathers bf16. The
 * rowwise backward re-casts W^T column-wise from the gathered fp8 weight
 * (Float8Linear's rule). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../lpx/commands.h"
#include "rank.h"

static const char *const names[TR_RECIPE_COUNT] = {
    "bf16", "float8-tensorwise", "float8-rowwise", "float8-delayed", "nf4-qlora", "mxfp8", "mxfp4", "f32",
    "float8-blockwise",
};

const char *tr_recipe_name(tr_recipe r) { return (unsigned)r < TR_RECIPE_COUNT ? names[r] : "?"; }

int tr_recipe_from_name(const char *name)
{
    for (int i = 0; i < TR_RECIPE_COUNT; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

bool tr_recipe_is_float8(tr_recipe r)
{
    return r == TR_F8_TENSORWISE || r == TR_F8_ROWWISE || r == TR_F8_DELAYED || r == TR_F8_BLOCKWISE;
}
bool tr_recipe_is_mx(tr_recipe r) { return r == TR_MXFP8 || r == TR_MXFP4; }

lpx_nf4_config tr_nf4_config(int64_t numel)
{
    /* the library's default picks the scaler block per tensor; resolved
     * here because the shard plan cuts at whole scaler blocks of rows */
    lpx_nf4_config c;
    (void)lpx_nf4_config_resolve(NULL, numel, &c);
    return c;
}

/* The MX kinds come from the lpx-mx.so plugin: already loaded (through
 * LPX_PLUGIN_PATH, or by the lpx command at start, lpx_tool_load_shipped). */
lpx_status tr_mx_kind(tr_recipe r, const lpx_kind **out)
{
    const char *kind = r == TR_MXFP8 ? "mxfp8" : "mxfp4";
    if (lpx_kind_find(kind, out) == LPX_OK) return LPX_OK;
    lpx_tool_load_shipped("plugins/mx", "lpx-mx.so");
    if (lpx_kind_find(kind, out) == LPX_OK) return LPX_OK;
    return lpx_error(LPX_EPLUGIN, "recipe %s needs the MX plugin lpx-mx.so (set LPX_PLUGIN_PATH to its directory)",
                     tr_recipe_name(r));
}

lpx_status tr_recipe_setup(tr_rank *R)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    if (tr_recipe_is_float8(R->recipe)) {
        const char *preset = R->recipe == TR_F8_TENSORWISE ? "tensorwise"
                             : R->recipe == TR_F8_ROWWISE  ? "rowwise"
                             : R->recipe == TR_F8_BLOCKWISE ? "blockwise"
                                                           : "delayed";
        TRY(lpx_float8_linear_recipe_preset(preset, &R->f8r));
        if (R->recipe == TR_F8_DELAYED) {
            /* one set of histories per micro-batch slot, so that a slot sees
             * the same data whatever the rank count (bit-identical losses
             * for --ranks 1 and N); the last slot serves evaluation */
            R->f8r.delayed.history_len = 16;
            R->f8slots = R->o->micro + 1;
            R->f8state = calloc((size_t)g->nparams * (size_t)R->f8slots, sizeof *R->f8state);
            if (!R->f8state) FAIL(LPX_ENOMEM, "train: out of memory");
            for (int p = 0; p < g->nparams; p++) {
                if (g->p[p].kind != TR_P_LIN) continue;
                for (int s = 0; s < R->f8slots; s++)
                    TRY(lpx_float8_linear_state_init(&R->f8state[p * R->f8slots + s], &R->f8r));
            }
        }
    }
    if (tr_recipe_is_mx(R->recipe)) TRY(tr_mx_kind(R->recipe, &R->mx_kind));
    if (R->recipe == TR_NF4_QLORA) {
        R->qopts = lpx_qlora_opts_default();
        R->qopts.alpha = 2.0 * R->o->lora_rank;
        /* the NF4 base and the adapters are engine params (shard.c) */
    }
out:
    return st;
}

lpx_status tr_recipe_reset_eval(tr_rank *R)
{
    lpx_status st = LPX_OK;
    if (!R->f8state) return LPX_OK;
    for (int p = 0; p < R->g->nparams; p++) {
        if (R->g->p[p].kind != TR_P_LIN) continue;
        lpx_float8_linear_state *s = &R->f8state[p * R->f8slots + R->f8slots - 1];
        lpx_float8_linear_state_destroy(s);
        TRY(lpx_float8_linear_state_init(s, &R->f8r));
    }
out:
    return st;
}

void tr_recipe_teardown(tr_rank *R)
{
    if (R->f8state) {
        for (int i = 0; i < R->g->nparams * R->f8slots; i++) lpx_float8_linear_state_destroy(&R->f8state[i]);
        free(R->f8state);
        R->f8state = NULL;
    }
    for (int p = 0; p < R->g->nparams; p++) {
        REL(R->ga[p]);
        REL(R->gb[p]);
    }
}

void tr_lin_saved_clear(tr_lin_saved *s)
{
    lpx_float8_linear_ctx_free(s->ctx);
    s->ctx = NULL;
    REL(s->x);
    REL(s->xa);
}

lpx_status tr_linear_forward(tr_rank *R, int p, int slot, lpx_tensor *x, lpx_tensor **y, tr_lin_saved *s)
{
    lpx_status st = LPX_OK;
    TRY(tr_need(R, p));
    switch (R->recipe) {
    case TR_F8_TENSORWISE:
    case TR_F8_ROWWISE:
    case TR_F8_DELAYED:
    case TR_F8_BLOCKWISE: {
        const lpx_float8_linear_state *state =
            R->f8state ? &R->f8state[p * R->f8slots + (slot < R->f8slots ? slot : R->f8slots - 1)] : NULL;
        TRY(lpx_float8_linear_forward(&R->f8r, state, x, R->full[p], NULL, y, s ? &s->ctx : NULL, NULL));
        break;
    }
    case TR_NF4_QLORA: {
        /* dropout only in training, with a mask that depends on (seed,
         * step, micro-batch, parameter) alone: counter-based, so the
         * random state of a run is its step (checkpoints need no more) */
        lpx_qlora_opts q = R->qopts;
        q.dropout = R->training ? R->o->lora_dropout : 0.0;
        q.seed = tr_rng_seed(R->o->seed, R->step, R->cur_chunk, p);
        if (s) s->q = q;
        TRY(lpx_qlora_linear(x, R->nf4[p], NULL, R->la[p], R->lb[p], &q, y, s ? &s->xa : NULL));
        break;
    }
    default: /* bf16, mx: the weight's kind decides the GEMM */
        TRY(lpx_linear(x, R->full[p], NULL, y));
        break;
    }
    if (lpx_tensor_dtype(*y) != lpx_tensor_dtype(x)) {
        /* a kind's GEMM may answer in f32 (MX dequantizes): the block
         * goes on in the activation dtype */
        lpx_tensor *c = NULL;
        TRY(lpx_cast(*y, lpx_tensor_dtype(x), false, &c));
        lpx_tensor_release(*y);
        *y = c;
    }
    if (s && !s->ctx) {
        lpx_tensor_retain(x);
        s->x = x;
    }
out:
    return st;
}

lpx_status tr_grad_accum(tr_rank *R, lpx_tensor **acc, lpx_tensor *g)
{
    if (lpx_tensor_dtype(g) != LPX_F32) {
        /* Float8Linear returns grad_W in W's dtype (bf16 when W was
         * gathered in bf16): accumulate and reduce in f32 */
        lpx_tensor *g32 = NULL;
        lpx_status st = lpx_cast(g, LPX_F32, false, &g32);
        if (st == LPX_OK) st = tr_grad_accum(R, acc, g32);
        lpx_tensor_release(g32);
        return st;
    }
    if (!*acc) {
        /* the first contribution becomes the accumulator: g is a fresh
         * result nobody else holds, and adding later ones to it in order
         * is the same f32 sum the collectives do in rank order */
        lpx_tensor_retain(g);
        *acc = g;
        tr_mem_add(&R->mem, TR_MEM_GRADS, tr_tensor_bytes(g));
        return LPX_OK;
    }
    return lpx_add_out(*acc, g, *acc);
}

lpx_status tr_linear_backward(tr_rank *R, int p, tr_lin_saved *s, lpx_tensor *g, lpx_tensor **gx, lpx_tensor **gw)
{
    lpx_status st = LPX_OK;
    lpx_tensor *gt = NULL, *ga = NULL, *gb = NULL;
    *gw = NULL;
    switch (R->recipe) {
    case TR_F8_TENSORWISE:
    case TR_F8_ROWWISE:
    case TR_F8_DELAYED:
    case TR_F8_BLOCKWISE:
        TRY(lpx_float8_linear_backward(s->ctx, g, gx, gw, NULL, NULL));
        break;
    case TR_NF4_QLORA:
        TRY(lpx_qlora_linear_backward(g, s->x, R->nf4[p], R->la[p], R->lb[p], s->xa, &s->q, gx, &ga, &gb));
        TRY(lpx_add_out(R->ga[p], ga, R->ga[p]));
        TRY(lpx_add_out(R->gb[p], gb, R->gb[p]));
        break;
    default:
        /* mx: straight-through, dgrad with the dense weight behind the MX one */
        TRY(lpx_matmul(g, R->full_dense[p] ? R->full_dense[p] : R->full[p], gx));
        TRY(lpx_t(g, &gt));
        TRY(lpx_matmul(gt, s->x, gw));
        break;
    }
    if (*gx && lpx_tensor_dtype(*gx) != lpx_tensor_dtype(g)) {
        lpx_tensor *c = NULL;   /* grad_x in the activation dtype, as the forward's output */
        TRY(lpx_cast(*gx, lpx_tensor_dtype(g), false, &c));
        lpx_tensor_release(*gx);
        *gx = c;
    }
out:
    lpx_tensor_release(gt);
    lpx_tensor_release(ga);
    lpx_tensor_release(gb);
    return st;
}
