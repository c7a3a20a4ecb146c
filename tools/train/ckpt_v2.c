/* `lpx train --resume` of the gathered checkpoint format (version 2: one
 * directory of full-shape f32 tensors written by rank 0, manifest.json
 * last), which lpx train wrote before it saved through the sharded
 * checkpoints of the library (ckpt.c, docs/CHECKPOINT.md). Read only,
 * never written any more: kept because tests/test_train.c
 * test_resume_gathered_format resumes its fixture tests/data/train_ckpt_v2
 * (runs saved then continue).
 *
 *   model.safetensors      every parameter's full f32 weights (nf4-qlora:
 *                          the f32 base and the adapters NAME.lora_a/_b)
 *   optimizer.safetensors  AdamW's m and v (NAME.exp_avg, NAME.exp_avg_sq),
 *                          each one's step count in __metadata__ (NAME.step)
 *   recipe.safetensors     float8-delayed: NAME.slotS.input|weight|grad_output
 *                          blobs of lpx_float8_delayed_save
 *   manifest.json          covered by its own checksum; each file's size
 *                          and FNV-1a 64 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rank.h"
#include "lpx/safetensors.h"
#include <inttypes.h>
#include <cjson/cJSON.h>

#define MODEL "model.safetensors"
#define OPTIM "optimizer.safetensors"
#define RECIPE "recipe.safetensors"

static const char *const state_names[3] = {"input", "weight", "grad_output"};

#define V2_VERSION 2
#define MANIFEST "manifest.json"
#define FORMAT "lpx-train-checkpoint"

/* The manifest covers itself: its "checksum" field holds the FNV-1a 64 of
 * the whole text with that field's 16 hex digits written as zeros. */
#define SUM_KEY "\"checksum\":"
static const char zeros16[] = "0000000000000000";

static uint64_t fnv_mem(const char *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001B3ull;
    return h;
}

static char *sum_digits(char *text)
{
    char *k = strstr(text, SUM_KEY);
    if (!k || strstr(k + 1, SUM_KEY)) return NULL;
    char *q = strchr(k + strlen(SUM_KEY), '"');
    if (!q || strlen(q) < 18 || q[17] != '"') return NULL;
    return q + 1;
}

/* manifest.json of DIR (its text and parsed root, the caller's to free):
 * its own checksum, its format and version, and every file it lists,
 * whole and unchanged. Sets ck->step and ck->has_recipe_state. */
lpx_status tr_ckpt_v2_open(const char *dir, tr_ckpt *ck, cJSON **out_root)
{
    lpx_status st = LPX_OK;
    char path[1400];
    char *text = NULL;
    cJSON *root = NULL;
    *out_root = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    size_t n = 0;
    st = tr_read_regular(path, 64u << 20, &text, &n);
    if (st) FAIL(LPX_EIO, "--resume '%s': cannot read %s", dir, MANIFEST);
    /* the manifest's own checksum first: every value in it is trusted
     * only after that (and then validated like the command line) */
    {
        char *d = sum_digits(text), want[17], hx[17];
        if (!d) FAIL(LPX_EINVAL, "--resume '%s': %s has no checksum: not a manifest this lpx wrote, or damaged", dir,
                     MANIFEST);
        memcpy(want, d, 16);
        want[16] = 0;
        memcpy(d, zeros16, 16);
        tr_hex64(fnv_mem(text, (size_t)n), hx);
        memcpy(d, want, 16);
        if (strcmp(hx, want))
            FAIL(LPX_EINVAL, "--resume '%s': %s has checksum (FNV-1a 64) %s, it records %s: the manifest was "
                 "edited or damaged", dir, MANIFEST, hx, want);
    }
    root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) FAIL(LPX_EINVAL, "--resume '%s': %s is not valid JSON", dir, MANIFEST);
    const char *fmt = tr_json_str(root, "format");
    int64_t ver = 0, step = 0;
    if (!fmt || strcmp(fmt, FORMAT) || !tr_json_int(root, "version", 0, 1000, &ver))
        FAIL(LPX_EINVAL, "--resume '%s': %s is not an lpx train checkpoint manifest", dir, MANIFEST);
    if (ver != V2_VERSION)
        FAIL(LPX_EINVAL, "--resume '%s': manifest version %lld; this lpx reads version %d (and the sharded checkpoints of version %d)", dir, (long long)ver, V2_VERSION, 3);
    if (!tr_json_int(root, "step", 1, 1000000, &step)) FAIL(LPX_EINVAL, "--resume '%s': manifest: bad \"step\"", dir);
    ck->step = (int)step;

    /* every file the manifest lists, whole and unchanged */
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files)) FAIL(LPX_EINVAL, "--resume '%s': manifest: no \"files\"", dir);
    bool has_model = false, has_optim = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        const char *name = tr_json_str(e, "name"), *hx = tr_json_str(e, "fnv1a64");
        int64_t bytes;
        if (!name || !hx || strchr(name, '/') || !tr_json_int(e, "bytes", 0, INT64_C(1) << 52, &bytes))
            FAIL(LPX_EINVAL, "--resume '%s': manifest: a malformed \"files\" entry", dir);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        uint64_t h, nb;
        if (tr_file_fnv(path, &h, &nb) != LPX_OK)
            FAIL(LPX_EINVAL, "--resume '%s': %s is missing: the checkpoint is incomplete", dir, name);
        char want[17];
        if (nb != (uint64_t)bytes)
            FAIL(LPX_EINVAL, "--resume '%s': %s has %llu bytes, the manifest records %lld: the checkpoint is damaged",
                 dir, name, (unsigned long long)nb, (long long)bytes);
        if (strcmp(tr_hex64(h, want), hx))
            FAIL(LPX_EINVAL, "--resume '%s': %s has checksum (FNV-1a 64) %s, the manifest records %s: the checkpoint "
                 "is damaged", dir, name, want, hx);
        has_model |= !strcmp(name, MODEL);
        has_optim |= !strcmp(name, OPTIM);
        ck->has_recipe_state |= !strcmp(name, RECIPE);
    }
    if (!has_model || !has_optim)
        FAIL(LPX_EINVAL, "--resume '%s': the manifest lists no %s", dir, has_model ? OPTIM : MODEL);

    *out_root = root;
    root = NULL;
out:
    free(text);
    cJSON_Delete(root);
    return st;
}

static bool is_1d(const tr_param *P) { return P->kind == TR_P_NORM || P->kind == TR_P_NORMF; }

typedef struct tr_tparam {
    int p;             /* model parameter */
    int which;         /* 0: the parameter, 1: its LoRA A, 2: its LoRA B */
    int idx;           /* index in its engine group */
    int64_t rows, cols;
    int ndim;
    char name[64];
} tr_tparam;

static int trainables(const tr_rank *R, tr_tparam *out)
{
    const tr_geom *g = R->g;
    int n = 0;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (R->recipe != TR_NF4_QLORA) {
            tr_tparam t = {.p = p, .which = 0, .idx = R->gi[p], .rows = P->rows, .cols = P->cols,
                           .ndim = is_1d(P) ? 1 : 2};
            snprintf(t.name, sizeof t.name, "%s", P->name);
            out[n++] = t;
        } else if (P->kind == TR_P_LIN) {
            int64_t r = R->o->lora_rank;
            tr_tparam a = {.p = p, .which = 1, .idx = R->ai[p], .rows = r, .cols = P->cols, .ndim = 2};
            tr_tparam b = {.p = p, .which = 2, .idx = R->bi[p], .rows = P->rows, .cols = r, .ndim = 2};
            snprintf(a.name, sizeof a.name, "%s.lora_a", P->name);
            snprintf(b.name, sizeof b.name, "%s.lora_b", P->name);
            out[n++] = a;
            out[n++] = b;
        }
    }
    return n;
}

char *tr_shape_str(const int64_t *s, int nd, char *buf, size_t n)
{
    size_t k = 0;
    buf[k++] = '[';
    for (int d = 0; d < nd && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)s[d]);
    if (k < n - 1) {
        buf[k++] = ']';
        buf[k] = 0;
    }
    return buf;
}

/* a dense f32 entry of the expected shape, or an error naming both shapes */
static lpx_status get_f32(lpx_safetensors *f, const tr_ckpt *ck, const char *file, const char *name, int ndim,
                          int64_t rows, int64_t cols, const char *what, lpx_tensor **out)
{
    *out = NULL;
    const char *kind = lpx_safetensors_kind_of(f, name);
    if (!kind)
        return lpx_error(LPX_EINVAL, "--resume '%s': %s has no %s '%s' (%s)", ck->dir, file, what, name,
                         "the checkpoint's model differs from this run's");
    lpx_status st = lpx_safetensors_get(f, name, out);
    if (st != LPX_OK) return st;
    int64_t want[2] = {rows, cols};
    const int64_t *s = lpx_tensor_shape(*out);
    bool same = !kind[0] && lpx_tensor_dtype(*out) == LPX_F32 && lpx_tensor_ndim(*out) == ndim &&
                s[0] == rows && (ndim == 1 || s[1] == cols) && lpx_tensor_is_contiguous(*out);
    if (!same) {
        char a[64], b[64];
        const tr_opts *c = &ck->cfg;
        st = lpx_error(LPX_EINVAL, "--resume '%s': %s %s is %s %s in the checkpoint but %s in this run (the checkpoint "
                       "has dim %d, layers %d, heads %d, seq %d, vocab %d, lora rank %d)", ck->dir, what, name,
                       lpx_dtype_name(lpx_tensor_dtype(*out)), tr_shape_str(s, lpx_tensor_ndim(*out), a, sizeof a),
                       tr_shape_str(want, ndim, b, sizeof b), c->m.dim, c->m.layers, c->m.heads, c->seq, ck->vocab,
                       c->lora_rank);
        REL(*out);
    }
    return st;
}

lpx_status tr_ckpt_v2_load_weights(const tr_ckpt *ck, const tr_geom *g, const tr_opts *o, float **w)
{
    lpx_status st = LPX_OK;
    lpx_safetensors *f = NULL;
    lpx_tensor *t = NULL;
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", ck->dir, MODEL);
    TRY(lpx_safetensors_open(path, &f));
    const tr_opts *c = &ck->cfg;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (!lpx_safetensors_kind_of(f, P->name)) {
            int64_t want[2] = {P->rows, P->cols};
            char b[64];
            FAIL(LPX_EINVAL, "--resume '%s': parameter %s %s of this run is not in the checkpoint (it has dim %d, "
                 "layers %d; this run dim %d, layers %d)", ck->dir, P->name, tr_shape_str(want, is_1d(P) ? 1 : 2, b,
                 sizeof b), c->m.dim, c->m.layers, g->dim, g->layers);
        }
        TRY(get_f32(f, ck, MODEL, P->name, is_1d(P) ? 1 : 2, P->rows, P->cols, "parameter", &t));
        memcpy(w[p], lpx_tensor_data(t), sizeof(float) * (size_t)(P->rows * P->cols));
        REL(t);
    }
    /* no parameter this run lacks (a deeper model) */
    for (int i = 0; i < lpx_safetensors_count(f); i++) {
        const char *name = lpx_safetensors_name(f, i);
        size_t n = strlen(name);
        if (n > 7 && (!strcmp(name + n - 7, ".lora_a") || !strcmp(name + n - 7, ".lora_b"))) continue;
        bool found = false;
        for (int p = 0; p < g->nparams && !found; p++) found = !strcmp(g->p[p].name, name);
        if (!found)
            FAIL(LPX_EINVAL, "--resume '%s': the checkpoint has parameter '%s', which this run does not (it has "
                 "layers %d, this run %d)", ck->dir, name, ck->cfg.m.layers, g->layers);
    }
    /* nf4-qlora: the adapters' shapes (the LoRA rank) */
    for (int p = 0; p < g->nparams && o->recipe == TR_NF4_QLORA; p++) {
        const tr_param *P = &g->p[p];
        if (P->kind != TR_P_LIN) continue;
        char name[80];
        snprintf(name, sizeof name, "%s.lora_a", P->name);
        TRY(get_f32(f, ck, MODEL, name, 2, o->lora_rank, P->cols, "adapter", &t));
        REL(t);
        snprintf(name, sizeof name, "%s.lora_b", P->name);
        TRY(get_f32(f, ck, MODEL, name, 2, P->rows, o->lora_rank, "adapter", &t));
        REL(t);
    }
    TRY(tr_ckpt_check_arch(ck, g));
out:
    lpx_tensor_release(t);
    lpx_safetensors_close(f);
    return st;
}

/* rows [start, start + len) of a full [rows, cols] f32 tensor into dst */
static void copy_rows(const lpx_tensor *full, int64_t start, int64_t len, int64_t cols, float *dst)
{
    if (len > 0) memcpy(dst, (const float *)lpx_tensor_data(full) + start * cols, sizeof(float) * (size_t)(len * cols));
}

lpx_status tr_ckpt_v2_load_rank(tr_rank *R, const tr_ckpt *ck)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    lpx_safetensors *fm = NULL, *fo = NULL, *fr = NULL;
    lpx_tensor *t = NULL, *m = NULL, *v = NULL, *lm = NULL, *lv = NULL;
    tr_tparam *tp = calloc((size_t)g->nparams * 2 + 1, sizeof *tp);
    char path[1400], name[96];
    if (!tp) FAIL(LPX_ENOMEM, "out of memory");
    int nt = trainables(R, tp);
    snprintf(path, sizeof path, "%s/%s", ck->dir, MODEL);
    TRY(lpx_safetensors_open(path, &fm));
    snprintf(path, sizeof path, "%s/%s", ck->dir, OPTIM);
    TRY(lpx_safetensors_open(path, &fo));
    for (int i = 0; i < nt; i++) {
        const tr_tparam *T = &tp[i];
        lpx_fsdp_group *G = R->grp[g->p[T->p].group];
        int64_t start, len;
        tr_shard_rows(R, T->rows, &start, &len);
        if (T->which) {
            /* nf4-qlora: the adapters (the base came in through init) */
            lpx_tensor *loc = lpx_fsdp_param_local(G, T->idx);
            TRY(get_f32(fm, ck, MODEL, T->name, 2, T->rows, T->cols, "adapter", &t));
            if (lpx_tensor_numel(loc) != len * T->cols)
                FAIL(LPX_EINTERNAL, "train: the local shard of %s has %lld elements, expected %lld", T->name,
                     (long long)lpx_tensor_numel(loc), (long long)(len * T->cols));
            copy_rows(t, start, len, T->cols, lpx_tensor_data(loc));
            REL(t);
        }
        snprintf(name, sizeof name, "%s.step", T->name);
        const char *sv = lpx_safetensors_metadata(fo, name);
        char *end = NULL;
        long long step = sv ? strtoll(sv, &end, 10) : -1;
        if (!sv || *end || step < 0)
            FAIL(LPX_EINVAL, "--resume '%s': %s has no valid step count for '%s'", ck->dir, OPTIM, T->name);
        if (step == 0) continue; /* no state yet */
        snprintf(name, sizeof name, "%s.exp_avg", T->name);
        TRY(get_f32(fo, ck, OPTIM, name, T->ndim, T->rows, T->cols, "optimizer state", &m));
        snprintf(name, sizeof name, "%s.exp_avg_sq", T->name);
        TRY(get_f32(fo, ck, OPTIM, name, T->ndim, T->rows, T->cols, "optimizer state", &v));
        int64_t ls[1] = {len * T->cols};
        TRY(lpx_empty(1, ls, LPX_F32, lpx_cpu(), &lm));
        TRY(lpx_empty(1, ls, LPX_F32, lpx_cpu(), &lv));
        copy_rows(m, start, len, T->cols, lpx_tensor_data(lm));
        copy_rows(v, start, len, T->cols, lpx_tensor_data(lv));
        TRY(lpx_fsdp_param_set_adamw_state(G, T->idx, lm, lv, step));
        REL(m);
        REL(v);
        REL(lm);
        REL(lv);
    }

    /* float8-delayed: every training slot (any rank count: slots follow
     * the global micro-batch index); slots the checkpoint lacks stay fresh */
    if (R->f8state && ck->has_recipe_state) {
        snprintf(path, sizeof path, "%s/%s", ck->dir, RECIPE);
        TRY(lpx_safetensors_open(path, &fr));
        for (int p = 0; p < g->nparams; p++) {
            if (g->p[p].kind != TR_P_LIN) continue;
            for (int s = 0; s < R->o->micro; s++) {
                lpx_float8_linear_state *S = &R->f8state[p * R->f8slots + s];
                lpx_float8_delayed *ds[3] = {S->input, S->weight, S->grad_output};
                for (int k = 0; k < 3; k++) {
                    snprintf(name, sizeof name, "%s.slot%d.%s", g->p[p].name, s, state_names[k]);
                    if (!ds[k] || !lpx_safetensors_kind_of(fr, name)) continue;
                    TRY(lpx_safetensors_get(fr, name, &t));
                    if (lpx_tensor_dtype(t) != LPX_U8 || !lpx_tensor_is_contiguous(t))
                        FAIL(LPX_EINVAL, "--resume '%s': %s: '%s' is not a u8 blob", ck->dir, RECIPE, name);
                    st = lpx_float8_delayed_load(ds[k], lpx_tensor_data(t), (size_t)lpx_tensor_numel(t));
                    if (st != LPX_OK) {
                        char msg[512];
                        snprintf(msg, sizeof msg, "%s", lpx_last_error());
                        FAIL(st, "--resume '%s': %s: '%s': %s", ck->dir, RECIPE, name, msg);
                    }
                    REL(t);
                }
            }
        }
    }
out:
    lpx_tensor_release(t);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    lpx_tensor_release(lm);
    lpx_tensor_release(lv);
    lpx_safetensors_close(fm);
    lpx_safetensors_close(fo);
    lpx_safetensors_close(fr);
    free(tp);
    return st;
}
