/* The Llama fixture's forward (tests/data/llama_tiny/) composed directly
 * from lpx ops on any device and dtype, independent of tools/train: the
 * check that the ops a Llama needs (embedding, rmsnorm, linear, rope,
 * grouped-query attention, silu, mul, add) compose to transformers'
 * logits in bf16 too, on the CPU (tests/test_llama.c) and on the GPU
 * (tests/gpu/test_cuda_attention.c). The rope frequencies are computed
 * here from the fixture's config (theta 500000, llama3 scaling: factor 8,
 * low 1, high 4, original context 64), as transformers does. */
#ifndef LPX_TESTS_LLAMA_REF_H
#define LPX_TESTS_LLAMA_REF_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"
#include "check.h"

#define LREF_DIM 64
#define LREF_LAYERS 2
#define LREF_HEADS 4
#define LREF_KV 2
#define LREF_HD 16
#define LREF_VOCAB 128

/* tensor `name` from either shard of dir, cast to dt and moved to dev */
static inline lpx_tensor *lref_weight(const char *dir, const char *name, lpx_dtype dt, lpx_device dev)
{
    const char *shards[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    lpx_tensor *t = NULL, *c = NULL, *d = NULL;
    for (int i = 0; i < 2 && !t; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, shards[i]);
        lpx_safetensors *f = NULL;
        if (lpx_safetensors_open(path, &f)) continue;
        if (lpx_safetensors_kind_of(f, name)) lpx_safetensors_get(f, name, &t);
        lpx_safetensors_close(f);
    }
    if (!t) {
        fprintf(stderr, "    fixture: no tensor %s\n", name);
        return NULL;
    }
    if (!lpx_cast(t, dt, false, &c) && lpx_tensor_to(c, dev, &d)) d = NULL;
    lpx_tensor_release(t);
    lpx_tensor_release(c);
    return d;
}

/* transformers' inv_freq with the llama3 adjustment, f32 */
static inline void lref_inv_freq(float *out)
{
    const float factor = 8.0f, low = 1.0f, high = 4.0f, old = 64.0f;
    for (int i = 0; i < LREF_HD / 2; i++) {
        float f = 1.0f / powf(500000.0f, (float)(2 * i) / (float)LREF_HD), wl = 2.0f * (float)M_PI / f;
        float scaled = wl > old / low ? f / factor : f;
        float smooth = (old / wl - low) / (high - low);
        bool medium = !(wl < old / high) && !(wl > old / low);
        out[i] = medium ? (1.0f - smooth) * scaled / factor + smooth * scaled : scaled;
    }
}

#define LREF_TRY(x) do { if ((st = (x)) != LPX_OK) goto out; } while (0)
#define LREF_SWAP(a, b) do { lpx_tensor_release(a); (a) = (b); (b) = NULL; } while (0)

/* logits [n, vocab] as f32 on the CPU, computed in dt on dev from the
 * fixture's weights for token ids ids[0..n) */
static inline lpx_status lref_forward(const char *dir, lpx_dtype dt, lpx_device dev, const int32_t *ids, int n,
                                      lpx_tensor **logits)
{
    lpx_status st = LPX_OK;
    lpx_tensor *idx = NULL, *x = NULL, *w = NULL, *a = NULL, *b = NULL, *r = NULL, *q = NULL, *k = NULL, *v = NULL,
               *fr = NULL, *o = NULL, *lse = NULL, *h1 = NULL, *u = NULL, *cpu_idx = NULL, *fr_cpu = NULL, *lg = NULL;
    char name[128];
    *logits = NULL;
    int64_t ns[1] = {n}, half = LREF_HD / 2;
    LREF_TRY(lpx_empty(1, ns, LPX_I32, lpx_cpu(), &cpu_idx));
    memcpy(lpx_tensor_data(cpu_idx), ids, sizeof(int32_t) * (size_t)n);
    LREF_TRY(lpx_tensor_to(cpu_idx, dev, &idx));
    LREF_TRY(lpx_empty(1, &half, LPX_F32, lpx_cpu(), &fr_cpu));
    lref_inv_freq(lpx_tensor_data(fr_cpu));
    LREF_TRY(lpx_tensor_to(fr_cpu, dev, &fr));
    if (!(w = lref_weight(dir, "model.embed_tokens.weight", dt, dev))) { st = LPX_EINVAL; goto out; }
    LREF_TRY(lpx_embedding(w, idx, &x));                          /* [n, D] */
    lpx_tensor_release(w), w = NULL;
    for (int l = 0; l < LREF_LAYERS; l++) {
        static const char *const proj[3] = {"q_proj", "k_proj", "v_proj"};
        lpx_tensor **dst[3] = {&q, &k, &v};
        const int heads[3] = {LREF_HEADS, LREF_KV, LREF_KV};
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
        LREF_TRY(lpx_rmsnorm(x, w, 1e-5, &a, &r));
        lpx_tensor_release(w), w = NULL;
        lpx_tensor_release(r), r = NULL;
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, proj[j]);
            if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
            LREF_TRY(lpx_linear(a, w, NULL, &b));
            lpx_tensor_release(w), w = NULL;
            int64_t s4[4] = {1, n, heads[j], LREF_HD};
            LREF_TRY(lpx_view(b, 4, s4, dst[j]));
            lpx_tensor_release(b), b = NULL;
            if (j < 2) {
                LREF_TRY(lpx_rope(*dst[j], fr, 0, &b));
                LREF_SWAP(*dst[j], b);
            }
        }
        lpx_tensor_release(a), a = NULL;
        LREF_TRY(lpx_attention(q, k, v, true, 0.25, &o, &lse));   /* 1/sqrt(16) */
        int64_t s2[2] = {n, LREF_DIM};
        LREF_TRY(lpx_view(o, 2, s2, &a));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", l);
        if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
        LREF_TRY(lpx_linear(a, w, NULL, &b));
        lpx_tensor_release(w), w = NULL;
        LREF_TRY(lpx_add(x, b, &h1));
        lpx_tensor_release(a), a = NULL;
        lpx_tensor_release(b), b = NULL;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
        LREF_TRY(lpx_rmsnorm(h1, w, 1e-5, &a, &r));
        lpx_tensor_release(w), w = NULL;
        lpx_tensor_release(r), r = NULL;
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
        if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
        LREF_TRY(lpx_linear(a, w, NULL, &b));
        lpx_tensor_release(w), w = NULL;
        LREF_TRY(lpx_silu(b, &u));
        lpx_tensor_release(b), b = NULL;
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
        LREF_TRY(lpx_linear(a, w, NULL, &b));
        lpx_tensor_release(w), w = NULL;
        LREF_TRY(lpx_mul_out(u, b, u));
        lpx_tensor_release(b), b = NULL;
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        if (!(w = lref_weight(dir, name, dt, dev))) { st = LPX_EINVAL; goto out; }
        LREF_TRY(lpx_linear(u, w, NULL, &b));
        lpx_tensor_release(w), w = NULL;
        lpx_tensor_release(x), x = NULL;
        LREF_TRY(lpx_add(h1, b, &x));
        lpx_tensor *rel[] = {a, b, u, h1, q, k, v, o, lse};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
        a = b = u = h1 = q = k = v = o = lse = NULL;
    }
    if (!(w = lref_weight(dir, "model.norm.weight", dt, dev))) { st = LPX_EINVAL; goto out; }
    LREF_TRY(lpx_rmsnorm(x, w, 1e-5, &a, &r));
    lpx_tensor_release(w), w = NULL;
    if (!(w = lref_weight(dir, "lm_head.weight", dt, dev))) { st = LPX_EINVAL; goto out; }
    LREF_TRY(lpx_linear(a, w, NULL, &b));
    LREF_TRY(lpx_cast(b, LPX_F32, false, &lg));
    LREF_TRY(lpx_tensor_to(lg, lpx_cpu(), logits));
out:;
    lpx_tensor *rel[] = {idx, x, w, a, b, r, q, k, v, fr, o, lse, h1, u, cpu_idx, fr_cpu, lg};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) lpx_tensor_release(rel[i]);
    return st;
}

/* max |a - ref| / max |ref| of the fixture's logits; NaN if unreadable */
static inline double lref_logits_error(const char *dir, lpx_tensor *got)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/logits.safetensors", dir);
    lpx_safetensors *f = NULL;
    lpx_tensor *ref = NULL;
    double err = NAN;
    if (!lpx_safetensors_open(path, &f) && !lpx_safetensors_get(f, "logits", &ref) &&
        lpx_tensor_numel(ref) == lpx_tensor_numel(got)) {
        const float *x = lpx_tensor_data(got), *y = lpx_tensor_data(ref);
        double d = 0, m = 0;
        for (int64_t i = 0; i < lpx_tensor_numel(ref); i++) {
            d = fmax(d, fabs((double)x[i] - y[i]));
            m = fmax(m, fabs((double)y[i]));
        }
        err = d / m;
    }
    lpx_tensor_release(ref);
    lpx_safetensors_close(f);
    return err;
}

/* the fixture's 24 token ids (tokens.bin, u32 little-endian) */
static inline int lref_tokens(const char *dir, int32_t *ids, int cap)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint32_t v;
    int n = 0;
    while (n < cap && fread(&v, 4, 1, f) == 1) ids[n++] = (int32_t)v;
    fclose(f);
    return n;
}

/* The fixture's forward composed on dev in f32 and in bf16 against
 * transformers' logits: f32 within 1e-5 of the largest logit (f32
 * arithmetic, other summation orders), bf16 within 3e-2 (weights and every
 * op's result rounded to bf16 once; the CPU measures 8.8e-3). `where`
 * names the device in the printed lines. Uses check.h's CHECK macros. */
static inline void lref_check_compose(const char *dir, lpx_device dev, const char *where)
{
    int32_t ids[64];
    int n = dir ? lref_tokens(dir, ids, 64) : 0;
    CHECKF(n == 24, "fixture tokens: %d (%s)", n, dir ? dir : "no fixture directory");
    if (n != 24) return;
    const lpx_dtype dts[2] = {LPX_F32, LPX_BF16};
    const double bound[2] = {1e-5, 3e-2};
    for (int i = 0; i < 2; i++) {
        lpx_tensor *lg = NULL;
        CHECK_OK(lref_forward(dir, dts[i], dev, ids, n, &lg));
        double e = lg ? lref_logits_error(dir, lg) : NAN;
        printf("  %s %s: logits %.2e of max |logit| from transformers'\n", lpx_dtype_name(dts[i]), where, e);
        CHECKF(e <= bound[i], "%s %s: logits off by %.3g (bound %.3g)", lpx_dtype_name(dts[i]), where, e, bound[i]);
        lpx_tensor_release(lg);
    }
}

#endif
