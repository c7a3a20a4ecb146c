/* Hugging Face checkpoints, reading: a transformers Llama directory in
 * (--init DIR, lpx eval); writing one (--save-hf DIR) is hf_write.c.
 *
 * In: config.json as transformers 4.x writes it (rope_theta and
 * rope_scaling at the top level) or as 5.x does (rope_parameters), and the
 * weights in model.safetensors or sharded as model-0000N-of-0000M.safetensors
 * with model.safetensors.index.json's weight_map; bf16, f16 or f32 (read
 * as f32). Every Llama parameter must be there with its shape; a tensor
 * that is not one (another architecture's, a bias) is refused, so a
 * checkpoint is never half-read. A tied head may be present or absent.
 * Out: model.safetensors with the f32 weights under the same names and
 * config.json: after --init DIR, DIR's config.json object with only the
 * dtype set to float32 (and a quantization_config dropped), every other
 * field as it was read, and DIR's other files (tokenizer, generation
 * config, ...) copied (tr_hf_check_copy); from scratch, the config lpx
 * writes (4.x keys, which 5.x reads too). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "hf.h"
#include "outfile.h"
#include "rank.h"
#include "lpx/checkpoint.h"

void tr_hf_name(const tr_param *P, char *buf, size_t n)
{
    static const char *const lin[TR_LIN_PER_BLOCK] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj",    "mlp.down_proj",
                                                      "mlp.up_proj"};
    switch (P->kind) {
    case TR_P_TOK: snprintf(buf, n, "model.embed_tokens.weight"); break;
    case TR_P_NORMF: snprintf(buf, n, "model.norm.weight"); break;
    case TR_P_HEAD: snprintf(buf, n, "lm_head.weight"); break;
    case TR_P_NORM:
        snprintf(buf, n, "model.layers.%d.%s.weight", P->layer, P->lin == 0 ? "input_layernorm" : "post_attention_layernorm");
        break;
    case TR_P_LIN: snprintf(buf, n, "model.layers.%d.%s.weight", P->layer, lin[P->lin]); break;
    }
}

/* Every field is read as transformers reads it or refused in one line: an
 * absent (or null) optional field takes LlamaConfig's default, a present
 * one of the wrong type or range is an error, never a silent default. */

/* what a JSON value is, for a message */
static void describe(const cJSON *j, char *buf, size_t n)
{
    if (cJSON_IsNumber(j)) snprintf(buf, n, "%.17g", j->valuedouble);
    else if (cJSON_IsString(j)) snprintf(buf, n, "the string \"%.40s\"", j->valuestring);
    else snprintf(buf, n, "%s", cJSON_IsBool(j) ? "a boolean" : cJSON_IsArray(j) ? "an array" : "an object");
}

/* KEY of o: absent or null leaves *out and sets *found false; else an
 * integer in [lo, hi] (not 64.5, not past int: reading one into an int
 * would be undefined) */
static lpx_status opt_int(const char *path, const cJSON *o, const char *key, int64_t lo, int64_t hi, int *out,
                          bool *found)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    int64_t x;
    *found = j && !cJSON_IsNull(j);
    if (!*found) return LPX_OK;
    if (!tr_json_int(o, key, lo, hi, &x)) {
        char v[80];
        describe(j, v, sizeof v);
        return lpx_error(LPX_EINVAL, "%s: \"%s\" is %s; it must be an integer in [%lld, %lld]", path, key, v,
                         (long long)lo, (long long)hi);
    }
    *out = (int)x;
    return LPX_OK;
}

static lpx_status need_int(const char *path, const cJSON *o, const char *key, int64_t lo, int *out)
{
    bool found;
    lpx_status st = opt_int(path, o, key, lo, INT32_MAX, out, &found);
    if (!st && !found) st = lpx_error(LPX_EINVAL, "%s has no \"%s\"; a Llama config needs it", path, key);
    return st;
}

/* KEY of o: absent or null leaves *out; else a finite number */
static lpx_status opt_num(const char *path, const cJSON *o, const char *key, double *out, bool *found)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *found = j && !cJSON_IsNull(j);
    if (!*found) return LPX_OK;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        char v[80];
        describe(j, v, sizeof v);
        return lpx_error(LPX_EINVAL, "%s: \"%s\" is %s; it must be a finite number", path, key, v);
    }
    *out = j->valuedouble;
    return LPX_OK;
}

/* KEY of o: absent or null leaves *out; else true or false */
static lpx_status opt_bool(const char *path, const cJSON *o, const char *key, bool *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return LPX_OK;
    if (!cJSON_IsBool(j)) {
        char v[80];
        describe(j, v, sizeof v);
        return lpx_error(LPX_EINVAL, "%s: \"%s\" is %s; it must be true or false", path, key, v);
    }
    *out = cJSON_IsTrue(j);
    return LPX_OK;
}

/* KEY of o: absent or null is NULL; else an object (else refused) */
static lpx_status opt_object(const char *path, const cJSON *o, const char *key, const cJSON **out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return LPX_OK;
    if (!cJSON_IsObject(j)) {
        char v[80];
        describe(j, v, sizeof v);
        return lpx_error(LPX_EINVAL, "%s: \"%s\" is %s; it must be an object (or null)", path, key, v);
    }
    *out = j;
    return LPX_OK;
}

/* KEY of o: absent or null is NULL; else a string (else refused) */
static lpx_status opt_str(const char *path, const cJSON *o, const char *key, const char **out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return LPX_OK;
    if (!cJSON_IsString(j)) {
        char v[80];
        describe(j, v, sizeof v);
        return lpx_error(LPX_EINVAL, "%s: \"%s\" is %s; it must be a string", path, key, v);
    }
    *out = j->valuestring;
    return LPX_OK;
}

static bool is_llama(const cJSON *root, char *what, size_t n)
{
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures"), *a;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    snprintf(what, n, "%s", cJSON_IsString(mt) ? mt->valuestring : "an unnamed");
    cJSON_ArrayForEach(a, archs) {
        if (cJSON_IsString(a) && !strcmp(a->valuestring, "LlamaForCausalLM")) return true;
        if (cJSON_IsString(a)) snprintf(what, n, "%s", a->valuestring);
    }
    return !cJSON_IsArray(archs) && cJSON_IsString(mt) && !strcmp(mt->valuestring, "llama");
}

/* rope_theta and the llama3 scaling: 4.x (rope_theta, rope_scaling) or
 * 5.x (rope_parameters holding both) */
static lpx_status read_rope(const char *path, const cJSON *root, tr_arch *a)
{
    lpx_status st;
    const cJSON *rp, *rs;
    bool found;
    if ((st = opt_object(path, root, "rope_parameters", &rp)) || (st = opt_object(path, root, "rope_scaling", &rs)))
        return st;
    if (rp) rs = rp;
    a->rope_theta = 10000.0;   /* LlamaConfig's default */
    if ((st = opt_num(path, root, "rope_theta", &a->rope_theta, &found))) return st;
    if (!found && rp && (st = opt_num(path, rp, "rope_theta", &a->rope_theta, &found))) return st;
    a->rope_factor = 0;
    if (!rs) return LPX_OK;
    const char *t = NULL;
    if ((st = opt_str(path, rs, "rope_type", &t))) return st;
    if (!t && (st = opt_str(path, rs, "type", &t))) return st;
    if (!t) t = "default";
    if (!strcmp(t, "default")) return LPX_OK;
    if (strcmp(t, "llama3"))
        return lpx_error(LPX_EINVAL, "%s: rope type '%s' is not supported (default and llama3 are)", path, t);
    bool f1, f2, f3, f4;
    if ((st = opt_num(path, rs, "factor", &a->rope_factor, &f1)) ||
        (st = opt_num(path, rs, "low_freq_factor", &a->rope_low, &f2)) ||
        (st = opt_num(path, rs, "high_freq_factor", &a->rope_high, &f3)) ||
        (st = opt_int(path, rs, "original_max_position_embeddings", 1, INT32_MAX, &a->rope_orig, &f4)))
        return st;
    if (!f1 || !f2 || !f3 || !f4)
        return lpx_error(LPX_EINVAL, "%s: llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                         "original_max_position_embeddings", path);
    /* 0 would read as "no scaling" below: refused here, the rest of the
     * range by tr_arch_check */
    if (!(a->rope_factor > 0))
        return lpx_error(LPX_EINVAL, "%s: llama3 rope scaling \"factor\" is %g; it must be >= 1", path, a->rope_factor);
    return LPX_OK;
}

lpx_status tr_hf_config(const char *dir, tr_arch *a)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root = NULL;
    memset(a, 0, sizeof *a);
    lpx_status st = tr_json_read(path, &root);
    if (st) {
        if (st == LPX_ENOTFOUND)
            return lpx_error(LPX_ENOTFOUND, "--init '%s' has no config.json: not a Hugging Face model directory", dir);
        return st;
    }
    char what[128];
    bool found;
    if (!is_llama(root, what, sizeof what))
        FAIL(LPX_EINVAL, "%s describes %s model; lpx reads Llama checkpoints (LlamaForCausalLM)", path, what);
    TRY(need_int(path, root, "hidden_size", 1, &a->dim));
    TRY(need_int(path, root, "num_hidden_layers", 1, &a->layers));
    TRY(need_int(path, root, "num_attention_heads", 1, &a->heads));
    TRY(need_int(path, root, "intermediate_size", 1, &a->ffn));
    TRY(need_int(path, root, "vocab_size", 2, &a->vocab));
    a->kv_heads = a->heads;   /* LlamaConfig: None is num_attention_heads */
    TRY(opt_int(path, root, "num_key_value_heads", 1, INT32_MAX, &a->kv_heads, &found));
    int maxpos;   /* not used (lpx trains at --seq), but read as transformers would */
    TRY(opt_int(path, root, "max_position_embeddings", 1, INT32_MAX, &maxpos, &found));
    a->norm_eps = 1e-6;        /* LlamaConfig's default */
    TRY(opt_num(path, root, "rms_norm_eps", &a->norm_eps, &found));
    TRY(opt_bool(path, root, "tie_word_embeddings", &a->tied));
    int hd = 0;
    TRY(opt_int(path, root, "head_dim", 1, INT32_MAX, &hd, &found));
    /* in 64 bits: head_dim * num_attention_heads may pass INT_MAX */
    if (found && (int64_t)hd * a->heads != a->dim)
        FAIL(LPX_EINVAL, "%s: head_dim %d is not hidden_size / num_attention_heads (%d); lpx's Llama needs it to be", path,
             hd, a->dim / a->heads);
    const char *act;
    TRY(opt_str(path, root, "hidden_act", &act));
    if (act && strcmp(act, "silu")) FAIL(LPX_EINVAL, "%s: hidden_act '%s': Llama's MLP is SwiGLU (silu)", path, act);
    static const char *const biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        bool on = false;
        TRY(opt_bool(path, root, biases[i], &on));
        if (on) FAIL(LPX_EINVAL, "%s: %s is true; lpx's Llama has no biases", path, biases[i]);
    }
    TRY(read_rope(path, root, a));
out:
    cJSON_Delete(root);
    return st;
}

/* ---- the weights ---- */

typedef struct hf_files {
    int n;
    char (*name)[256];
    lpx_safetensors **f;
    cJSON *map;               /* index.json's weight_map (NULL: one file) */
    cJSON *index;
} hf_files;

static void files_close(hf_files *h)
{
    for (int i = 0; i < h->n; i++) lpx_safetensors_close(h->f[i]);
    free(h->name);
    free(h->f);
    cJSON_Delete(h->index);
    memset(h, 0, sizeof *h);
}

static lpx_status open_one(const char *dir, const char *file, hf_files *h, int *at)
{
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->name[i], file)) {
            *at = i;
            return LPX_OK;
        }
    if (strlen(file) >= 256 || strchr(file, '/'))
        return lpx_error(LPX_EINVAL, "--init '%s': index names a file '%s' outside the directory", dir, file);
    void *nn = realloc(h->name, sizeof *h->name * (size_t)(h->n + 1)), *nf = nn ? realloc(h->f, sizeof *h->f * (size_t)(h->n + 1)) : NULL;
    if (nn) h->name = nn;
    if (nf) h->f = nf;
    if (!nn || !nf) return lpx_error(LPX_ENOMEM, "out of memory");
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (access(path, R_OK) != 0)
        return lpx_error(LPX_ENOTFOUND, "--init '%s': %s is missing (%s)", dir, file,
                         h->index ? "a shard model.safetensors.index.json names" : "no weights");
    lpx_status st = lpx_safetensors_open(path, &h->f[h->n]);
    if (st) return st;
    snprintf(h->name[h->n], 256, "%s", file);
    *at = h->n++;
    return LPX_OK;
}

typedef struct hf_tensor {
    const char *name;
    int file;
} hf_tensor;

static int cmp_tensor(const void *a, const void *b)
{
    const hf_tensor *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

/* Every tensor in exactly one file, and where the index says it is: eval
 * reads a tensor through the weight_map, train's ranks from the first
 * file that holds it, so two copies (or a map that disagrees with the
 * shards) would give two different models. */
static lpx_status check_unique(const char *dir, const hf_files *h)
{
    size_t n = 0, k = 0;
    for (int i = 0; i < h->n; i++) n += (size_t)lpx_safetensors_count(h->f[i]);
    hf_tensor *all = malloc(sizeof *all * (n ? n : 1));
    if (!all) return lpx_error(LPX_ENOMEM, "--init '%s': out of memory", dir);
    for (int i = 0; i < h->n; i++)
        for (int j = 0; j < lpx_safetensors_count(h->f[i]); j++) all[k++] = (hf_tensor){lpx_safetensors_name(h->f[i], j), i};
    qsort(all, n, sizeof *all, cmp_tensor);
    lpx_status st = LPX_OK;
    for (size_t i = 1; i < n && !st; i++)
        if (!strcmp(all[i - 1].name, all[i].name)) {
            const char *a = h->name[all[i - 1].file], *b = h->name[all[i].file], *x = a;
            if (strcmp(a, b) > 0) a = b, b = x;   /* the files in name order, whatever the map's */
            st = lpx_error(LPX_EINVAL, "--init '%s': tensor '%s' is in both %s and %s; refused rather than read from "
                           "either", dir, all[i].name, a, b);
        }
    for (size_t i = 0; i < n && !st && h->map; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(h->map, all[i].name);
        if (!e)
            st = lpx_error(LPX_EINVAL, "--init '%s': %s holds '%s', which model.safetensors.index.json's weight_map does "
                           "not list", dir, h->name[all[i].file], all[i].name);
        else if (strcmp(e->valuestring, h->name[all[i].file]))
            st = lpx_error(LPX_EINVAL, "--init '%s': tensor '%s' is in %s, but model.safetensors.index.json's weight_map "
                           "puts it in %s", dir, all[i].name, h->name[all[i].file], e->valuestring);
    }
    free(all);
    if (st || !h->map) return st;
    /* and every name the map lists is where it says */
    const cJSON *e;
    cJSON_ArrayForEach(e, h->map) {
        for (int i = 0; i < h->n; i++)
            if (!strcmp(h->name[i], e->valuestring) && !lpx_safetensors_kind_of(h->f[i], e->string))
                return lpx_error(LPX_EINVAL, "--init '%s': model.safetensors.index.json's weight_map puts '%s' in %s, "
                                 "which does not hold it", dir, e->string, e->valuestring);
    }
    return LPX_OK;
}

static lpx_status files_open(const char *dir, hf_files *h)
{
    memset(h, 0, sizeof *h);
    char path[1200], single[1200];
    int at;
    lpx_status st;
    /* transformers' order: model.safetensors when there is one, else the
     * index (a --save-hf over a sharded model leaves no index, but a save
     * cut short between the two would) */
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(single, F_OK) == 0 || access(path, F_OK) != 0) {
        if ((st = open_one(dir, "model.safetensors", h, &at))) files_close(h);
        return st;
    }
    TRY(tr_json_read(path, &h->index));
    cJSON *map = cJSON_GetObjectItemCaseSensitive(h->index, "weight_map");
    if (!cJSON_IsObject(map)) FAIL(LPX_EINVAL, "%s has no weight_map object", path);
    /* every shard it names must be there (and valid) before anything is read */
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e)) FAIL(LPX_EINVAL, "%s: weight_map entry '%s' is not a file name", path, e->string);
        TRY(open_one(dir, e->valuestring, h, &at));
    }
    if (h->n == 0) FAIL(LPX_EINVAL, "%s: weight_map is empty", path);
    h->map = map;
    TRY(check_unique(dir, h));
    return LPX_OK;
out:
    files_close(h);
    return st;
}

/* the file holding `name`, or NULL */
static lpx_safetensors *file_of(const hf_files *h, const char *name)
{
    if (!h->map) return lpx_safetensors_kind_of(h->f[0], name) ? h->f[0] : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(h->map, name);
    if (!cJSON_IsString(e)) return NULL;
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->name[i], e->valuestring)) return lpx_safetensors_kind_of(h->f[i], name) ? h->f[i] : NULL;
    return NULL;
}

static bool known(const tr_geom *g, const char *name)
{
    char hn[96];
    size_t n = strlen(name);
    /* rotary tables older checkpoints carry: recomputed, never read */
    if (n > 21 && !strcmp(name + n - 21, "rotary_emb.inv_freq")) return true;
    if (g->tied && !strcmp(name, "lm_head.weight")) return true;   /* a tied copy: the embedding is read */
    for (int p = 0; p < g->nparams; p++) {
        tr_hf_name(&g->p[p], hn, sizeof hn);
        if (!strcmp(hn, name)) return true;
    }
    return false;
}

lpx_status tr_hf_load(const char *dir, const tr_geom *g, float **w)
{
    lpx_status st = LPX_OK;
    hf_files h;
    lpx_tensor *t = NULL, *c = NULL;
    TRY(files_open(dir, &h));
    /* nothing that is not a Llama parameter of this shape of model */
    for (int i = 0; i < h.n; i++)
        for (int k = 0; k < lpx_safetensors_count(h.f[i]); k++) {
            const char *name = lpx_safetensors_name(h.f[i], k);
            if (!known(g, name))
                FAIL(LPX_EINVAL, "--init '%s': %s holds '%s', which is not a parameter of the Llama model config.json "
                     "describes (%d layers%s)", dir, h.name[i], name, g->layers, g->tied ? ", tied head" : "");
        }
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        char hn[96];
        tr_hf_name(P, hn, sizeof hn);
        lpx_safetensors *f = file_of(&h, hn);
        if (!f) FAIL(LPX_EINVAL, "--init '%s': no tensor '%s' (the model config.json describes needs it)", dir, hn);
        TRY(lpx_safetensors_get(f, hn, &t));
        bool is1d = P->kind == TR_P_NORM || P->kind == TR_P_NORMF;
        const int64_t *s = lpx_tensor_shape(t);
        lpx_dtype dt = lpx_tensor_dtype(t);
        bool shape_ok = lpx_tensor_ndim(t) == (is1d ? 1 : 2) && s[0] == P->rows && (is1d || s[1] == P->cols);
        if (!shape_ok || lpx_tensor_kind(t) || (dt != LPX_BF16 && dt != LPX_F16 && dt != LPX_F32)) {
            char sh[128];
            FAIL(LPX_EINVAL, "--init '%s': %s is %s %s; config.json says [%lld%s%lld] (bf16, f16 or f32)", dir, hn,
                 lpx_dtype_name(dt), lpx_tensor_shape_str(t, sh, sizeof sh), (long long)P->rows, is1d ? "" : ", ",
                 is1d ? 0LL : (long long)P->cols);
        }
        if (w) {   /* NULL: checked only (the ranks import their rows: tr_hf_import) */
            TRY(lpx_cast(t, LPX_F32, false, &c));
            memcpy(w[p], lpx_tensor_data(c), sizeof(float) * (size_t)(P->rows * P->cols));
        }
        lpx_tensor_release(t);
        lpx_tensor_release(c);
        t = c = NULL;
    }
out:
    lpx_tensor_release(t);
    lpx_tensor_release(c);
    files_close(&h);
    return st;
}

/* ---- --init DIR read by rows on the ranks ---- */

/* the Hugging Face name of the engine's parameter i of group gr */
bool tr_hf_group_name(void *ctx, lpx_fsdp_group *gr, int i, char *buf, size_t len)
{
    const tr_rank *R = ctx;
    for (int p = 0; p < R->g->nparams; p++)
        if (R->grp[R->g->p[p].group] == gr && R->gi[p] == i) {
            tr_hf_name(&R->g->p[p], buf, len);
            return true;
        }
    return false;   /* not a model weight (none today) */
}

lpx_status tr_hf_import(tr_rank *R, const char *dir)
{
    hf_files h;
    lpx_status st = files_open(dir, &h);
    if (!st) st = lpx_fsdp_import(R->fsdp, h.n, h.f, tr_hf_group_name, R);
    files_close(&h);
    return st;
}
