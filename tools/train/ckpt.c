/* Checkpoints of `lpx train`: --save DIR, --save-every N, --resume DIR;
 * this file reads them (--resume), ckpt_save.c writes them.
 *
 * A checkpoint is the library's sharded checkpoint of the run's engine
 * (lpx_fsdp_save_ex, include/lpx/checkpoint.h, docs/CHECKPOINT.md): every
 * rank writes its own shards (f32 masters, float8_weight masters, the NF4
 * base and LoRA adapters of nf4-qlora, AdamW's moments and steps) to
 * DIR/rank-R-of-W.safetensors; the trainer adds
 *   user object "lpx-train-checkpoint" version 3: the step, the run
 *       configuration, the data position and random state, the loss
 *       history (the index, and with it this record, is covered by its own
 *       checksum)
 *   extra tensors "f8/NAME.slotS.input|weight|grad_output" (float8-delayed):
 *       each rank's training slots' lpx_float8_delayed_save blobs
 * and the library commits it atomically (the index written last, after
 * every rank's file is durable; DIR exchanged with the previous one). No
 * rank gathers anything, and --resume reads it at any --ranks: each rank
 * reads the rows of its new shards, and the slots it runs now.
 *
 * The gathered format lpx train wrote before (version 2, manifest.json)
 * is still read (ckpt_v2.c); a save over such a directory replaces it
 * atomically. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "rank.h"
#include "lpx/checkpoint.h"

#define FORMAT "lpx-train-checkpoint"
#define VERSION 3  /* 3: the library's sharded checkpoint; 2: gathered (ckpt_v2.c) */
#define INDEX "index.json"
#define MANIFEST "manifest.json"

static const char *const state_names[3] = {"input", "weight", "grad_output"};

static bool has_file(const char *dir, const char *name)
{
    char p[1400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}
/* ---- resume ---- */

void tr_ckpt_free(tr_ckpt *ck)
{
    free(ck->hist);
    ck->hist = NULL;
    lpx_fsdp_ckpt_close(ck->hold);
    ck->hold = NULL;
}

/* The run record (either format): the step, the configuration, the
 * data position, the history. */
static lpx_status parse_run(const char *dir, const cJSON *root, tr_ckpt *ck)
{
    lpx_status st = LPX_OK;
    int64_t step = 0, x = 0;
    if (!tr_json_int(root, "step", 1, 1000000, &step)) FAIL(LPX_EINVAL, "--resume '%s': checkpoint record: bad \"step\"", dir);
    ck->step = (int)step;
    /* the run configuration */
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *lr = cJSON_GetObjectItemCaseSensitive(c, "lr_schedule");
    const char *rn = tr_json_str(c, "recipe"), *wrap = tr_json_str(c, "wrap"), *comm = tr_json_str(c, "comm");
    int64_t v[11] = {0};
    static const char *const keys[10] = {"ranks", "micro", "batch", "seq", "dim", "layers", "heads", "vocab",
                                         "lora_rank", "seed"};
    bool ok = rn && tr_recipe_from_name(rn) >= 0 && wrap && comm && cJSON_IsObject(lr);
    for (int k = 0; k < 10 && ok; k++) ok = tr_json_int(c, keys[k], 0, 2147483647, &v[k]);
    if (ok && !tr_json_int(c, "eval", 1, 100000, &v[10])) v[10] = 0; /* optional: 0 keeps the run's */
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(lr, "peak"),
                *drop = cJSON_GetObjectItemCaseSensitive(c, "lora_dropout");
    ok = ok && cJSON_IsNumber(peak) && cJSON_IsNumber(drop) && tr_json_int(lr, "steps", 1, 1000000, &x);
    if (!ok) FAIL(LPX_EINVAL, "--resume '%s': checkpoint record: a malformed \"config\"", dir);
    tr_opts *o = &ck->cfg;
    o->recipe = (tr_recipe)tr_recipe_from_name(rn);
    o->ranks = (int)v[0];
    o->micro = (int)v[1];
    o->batch = (int)v[2];
    o->seq = (int)v[3];
    o->m.dim = (int)v[4];
    o->m.layers = (int)v[5];
    o->m.heads = (int)v[6];
    ck->vocab = o->m.vocab = (int)v[7];
    int64_t kvh = 0, ffn = 0;
    const cJSON *theta = cJSON_GetObjectItemCaseSensitive(c, "rope_theta"),
                *eps = cJSON_GetObjectItemCaseSensitive(c, "norm_eps"),
                *rs = cJSON_GetObjectItemCaseSensitive(c, "rope_llama3"),
                *tied = cJSON_GetObjectItemCaseSensitive(c, "tied");
    if (!tr_json_int(c, "kv_heads", 1, 1 << 20, &kvh) || !tr_json_int(c, "ffn", 1, 1 << 24, &ffn) || !cJSON_IsNumber(theta) ||
        !cJSON_IsNumber(eps) || !cJSON_IsBool(tied) || !cJSON_IsArray(rs) || cJSON_GetArraySize(rs) != 4)
        FAIL(LPX_EINVAL, "--resume '%s': checkpoint record: a malformed \"config\" (the model's kv_heads, ffn, tied, rope_theta, "
             "norm_eps, rope_llama3)", dir);
    o->m.kv_heads = (int)kvh;
    o->m.ffn = (int)ffn;
    o->m.tied = cJSON_IsTrue(tied);
    o->m.rope_theta = theta->valuedouble;
    o->m.norm_eps = eps->valuedouble;
    double rv[4];
    for (int k = 0; k < 4; k++) {
        const cJSON *it = cJSON_GetArrayItem(rs, k);
        rv[k] = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    }
    o->m.rope_factor = rv[0];
    o->m.rope_low = rv[1];
    o->m.rope_high = rv[2];
    o->m.rope_orig = isfinite(rv[3]) && rv[3] >= 0 && rv[3] < 1e9 ? (int)rv[3] : -1;
    o->lora_rank = (int)v[8];
    o->seed = (uint64_t)v[9];
    o->eval_batches = (int)v[10];
    o->steps = (int)x;
    o->lr = peak->valuedouble;
    o->lora_dropout = drop->valuedouble;
    o->wrap_linear = !strcmp(wrap, "linear");
    snprintf(o->comm, sizeof o->comm, "%s", comm);
    /* --optim / --master (absent in older records: adamw, f32) */
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(c, "adamw");
    const char *on = tr_json_str(ad, "optim"), *ms = tr_json_str(ad, "master");
    static const char *const onames[] = {"adamw", "adamw8bit", "adamw4bit", "adamw-fp8"};
    o->optim = 0;
    o->master = ms && tr_master_from_name(ms) > 0 ? tr_master_from_name(ms) : 0;
    const cJSON *ob = cJSON_GetObjectItemCaseSensitive(ad, "block");
    o->optim_block = cJSON_IsNumber(ob) ? (int)ob->valuedouble : 0;
    for (int k = 0; on && k < 4; k++)
        if (!strcmp(on, onames[k])) o->optim = k;

    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const char *dp = tr_json_str(data, "path"), *dh = tr_json_str(data, "fnv1a64");
    int64_t dbytes = 0;
    if (dp) snprintf(ck->data_path, sizeof ck->data_path, "%s", dp);
    if (dh && tr_json_int(data, "bytes", 0, INT64_C(1) << 52, &dbytes)) {
        ck->data_fnv = strtoull(dh, NULL, 16);
        ck->data_bytes = (uint64_t)dbytes;
    }
    int64_t sk = 0;
    if (tr_json_int(root, "skipped_steps", 0, 1000000, &sk)) ck->skipped = (int)sk;
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(root, "val_loss_start");
    if (cJSON_IsNumber(vs)) ck->val_start = vs->valuedouble;
    const cJSON *hist = cJSON_GetObjectItemCaseSensitive(root, "history");
    int nh = cJSON_IsArray(hist) ? cJSON_GetArraySize(hist) : 0;
    ck->hist = calloc((size_t)nh + 1, sizeof *ck->hist);
    if (!ck->hist) FAIL(LPX_ENOMEM, "out of memory");
    const cJSON *row;
    cJSON_ArrayForEach(row, hist) {
        double vals[4] = {NAN, 0, 0, 0};
        for (int k = 0; k < 4; k++) {
            const cJSON *it = cJSON_GetArrayItem(row, k);
            if (cJSON_IsNumber(it)) vals[k] = it->valuedouble;
        }
        ck->hist[ck->nhist++] = (tr_step_rec){vals[0], vals[1], vals[2], vals[3], 0};
    }
out:
    return st;
}

lpx_status tr_ckpt_open(const char *dir, tr_ckpt *ck)
{
    lpx_status st = LPX_OK;
    cJSON *root = NULL;
    lpx_fsdp_ckpt *c = NULL;
    memset(ck, 0, sizeof *ck);
    ck->val_start = NAN;
    snprintf(ck->dir, sizeof ck->dir, "%s", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        FAIL(LPX_ENOTFOUND, "--resume '%s': no such checkpoint directory", dir);
    if (has_file(dir, INDEX)) {
        /* the library checks the index's own checksum, and the rank files'
         * sizes and checksums as they are read */
        st = lpx_fsdp_ckpt_open(dir, &c);
        if (st) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", lpx_last_error());
            FAIL(st, "--resume '%s': %s", dir, msg);
        }
        const char *user = lpx_fsdp_ckpt_user(c);
        root = user ? cJSON_Parse(user) : NULL;
        const char *fmt = tr_json_str(root, "format");
        int64_t ver = 0;
        if (!root || !fmt || strcmp(fmt, FORMAT) || !tr_json_int(root, "version", 0, 1000, &ver))
            FAIL(LPX_EINVAL, "--resume '%s': a sharded checkpoint without lpx train's record of the run (saved by "
                 "lpx_fsdp_save, not by lpx train?)", dir);
        if (ver != VERSION)
            FAIL(LPX_EINVAL, "--resume '%s': record version %lld; this lpx reads version %d", dir, (long long)ver,
                 VERSION);
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "recipe_state");
        ck->has_recipe_state = cJSON_IsTrue(rs);
        ck->sharded = true;
        ck->saved_world = lpx_fsdp_ckpt_world(c);
        ck->hold = c;   /* open (and so share-locked) until the ranks have loaded it */
        c = NULL;
    } else if (has_file(dir, MANIFEST)) {
        TRY(tr_ckpt_v2_open(dir, ck, &root));
    } else {
        FAIL(LPX_ENOTFOUND, "--resume '%s': no %s: not a complete lpx train checkpoint (a save writes its index "
             "last; an interrupted one leaves none)", dir, INDEX);
    }
    TRY(parse_run(dir, root, ck));
out:
    lpx_fsdp_ckpt_close(c);
    cJSON_Delete(root);
    if (st != LPX_OK) tr_ckpt_free(ck);
    return st;
}

static int bad_resume(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_resume(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lpx train: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int tr_ckpt_apply(const tr_ckpt *ck, tr_opts *o)
{
    const tr_opts *c = &ck->cfg;
    if (!(o->given & TR_GIVEN_RECIPE)) o->recipe = c->recipe;
    if (!(o->given & TR_GIVEN_RANKS) && !strcmp(o->comm, "local")) o->ranks = c->ranks;
    if (!(o->given & TR_GIVEN_MICRO)) o->micro = c->micro;
    if (!(o->given & TR_GIVEN_BATCH)) o->batch = c->batch;
    if (!(o->given & TR_GIVEN_SEQ)) o->seq = c->seq;
    /* the model: the checkpoint's, unless the command line changes it (the
     * weights' shapes are then checked against the run's) */
    tr_arch m = c->m;
    if (o->given & TR_GIVEN_MODEL) m = o->m;
    if (o->given & TR_GIVEN_DIM) m.dim = o->m.dim;
    if (o->given & TR_GIVEN_LAYERS) m.layers = o->m.layers;
    if (o->given & TR_GIVEN_HEADS) m.heads = o->m.heads;
    if (o->given & TR_GIVEN_KV_HEADS) m.kv_heads = o->m.kv_heads;
    if (o->given & TR_GIVEN_FFN) m.ffn = o->m.ffn;
    if (o->given & TR_GIVEN_VOCAB) m.vocab = o->m.vocab;
    if (o->given & TR_GIVEN_ROPE_THETA) m.rope_theta = o->m.rope_theta;
    if (o->given & TR_GIVEN_TIED) m.tied = true;
    o->m = m;
    if (!(o->given & TR_GIVEN_LR)) o->lr = c->lr;
    if (!o->optim_given) o->optim = c->optim;
    if (!o->master_given) o->master = c->master;
    if (!o->optim_block_given) o->optim_block = c->optim_block;
    if (!(o->given & TR_GIVEN_SEED)) o->seed = c->seed;
    if (!(o->given & TR_GIVEN_STEPS)) o->steps = c->steps;
    if (!(o->given & TR_GIVEN_WRAP)) o->wrap_linear = c->wrap_linear;
    if (!(o->given & TR_GIVEN_LORA_RANK)) o->lora_rank = c->lora_rank;
    if (!(o->given & TR_GIVEN_LORA_DROPOUT)) o->lora_dropout = c->lora_dropout;
    if (!(o->given & TR_GIVEN_DATA) && ck->data_path[0]) o->data_path = ck->data_path;
    if (!(o->given & TR_GIVEN_EVAL) && c->eval_batches > 0) o->eval_batches = c->eval_batches;
    if ((o->recipe == TR_NF4_QLORA) != (c->recipe == TR_NF4_QLORA))
        return bad_resume("--resume '%s': a %s checkpoint cannot resume under --recipe %s (nf4-qlora trains adapters "
                          "on a frozen base; the other recipes train every weight)", ck->dir,
                          tr_recipe_name(c->recipe), tr_recipe_name(o->recipe));
    int rc = tr_check_opts(o);
    if (rc) return rc;
    if (ck->step >= o->steps && !(o->stop_after == ck->step && o->save_dir))
        return bad_resume("--resume '%s': the checkpoint is at step %d; --steps %d leaves nothing to run", ck->dir,
                          ck->step, o->steps);
    /* --stop-after at the checkpoint's step with --save: no step, the state
     * saved again under this run's --ranks (a resharding conversion) */
    if (o->stop_after && o->stop_after == ck->step && o->save_dir) return 0;
    if (o->stop_after && o->stop_after <= ck->step)
        return bad_resume("--resume '%s': the checkpoint is at step %d; --stop-after %d is not beyond it", ck->dir,
                          ck->step, o->stop_after);
    return 0;
}

/* ---- the model, checked before it is built (sharded checkpoints) ---- */

static bool is_1d(const tr_param *P) { return P->kind == TR_P_NORM || P->kind == TR_P_NORMF; }

/* Finds parameter `name` in the checkpoint's list; -1 if absent. */
static int find_info(const lpx_fsdp_ckpt_param_info *info, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(info[i].name, name)) return i;
    return -1;
}

/* One parameter of this run against the checkpoint's: present, and of the
 * same shape (the messages name both shapes). */
static lpx_status check_one(const tr_ckpt *ck, const tr_geom *g, const lpx_fsdp_ckpt_param_info *info, int n,
                            bool *seen, const char *name, const char *what, int ndim, int64_t rows, int64_t cols)
{
    const tr_opts *c = &ck->cfg;
    int64_t want[2] = {rows, cols};
    char a[64], b[64];
    int i = find_info(info, n, name);
    if (i < 0)
        return lpx_error(LPX_EINVAL, "--resume '%s': %s %s %s of this run is not in the checkpoint (it has dim %d, "
                         "layers %d; this run dim %d, layers %d)", ck->dir, what, name,
                         tr_shape_str(want, ndim, b, sizeof b), c->m.dim, c->m.layers, g->dim, g->layers);
    seen[i] = true;
    bool same = info[i].ndim == ndim && info[i].shape[0] == rows && (ndim == 1 || info[i].shape[1] == cols);
    if (!same)
        return lpx_error(LPX_EINVAL, "--resume '%s': %s %s is %s %s in the checkpoint but %s in this run (the checkpoint "
                         "has dim %d, layers %d, heads %d, seq %d, vocab %d, lora rank %d)", ck->dir, what, name,
                         lpx_dtype_name(info[i].dtype), tr_shape_str(info[i].shape, info[i].ndim, a, sizeof a),
                         tr_shape_str(want, ndim, b, sizeof b), c->m.dim, c->m.layers, c->m.heads, c->seq, ck->vocab,
                         c->lora_rank);
    return LPX_OK;
}

lpx_status tr_ckpt_check_arch(const tr_ckpt *ck, const tr_geom *g)
{
    const tr_opts *cc = &ck->cfg;
    /* the same shapes with other heads would be another model */
    if (cc->m.heads != g->heads)
        return lpx_error(LPX_EINVAL, "--resume '%s': the checkpoint's model has %d attention heads, this run %d "
                         "(--heads)", ck->dir, cc->m.heads, g->heads);
    if (cc->m.rope_theta != g->a.rope_theta || cc->m.rope_factor != g->a.rope_factor || cc->m.tied != g->tied)
        return lpx_error(LPX_EINVAL, "--resume '%s': the checkpoint's model has rope_theta %g%s%s; this run %g%s%s",
                         ck->dir, cc->m.rope_theta, cc->m.rope_factor != 0 ? " with llama3 scaling" : "",
                         cc->m.tied ? ", a tied head" : "", g->a.rope_theta,
                         g->a.rope_factor != 0 ? " with llama3 scaling" : "", g->tied ? ", a tied head" : "");
    return LPX_OK;
}

lpx_status tr_ckpt_check_model(const tr_ckpt *ck, const tr_geom *g, const tr_opts *o)
{
    if (!ck->sharded) return LPX_OK;   /* checked as its weights are read (tr_ckpt_v2_load_weights) */
    lpx_status st = LPX_OK;
    lpx_fsdp_ckpt *c = NULL;
    lpx_fsdp_ckpt_param_info *info = NULL;
    bool *seen = NULL;
    const tr_opts *cc = &ck->cfg;
    TRY(lpx_fsdp_ckpt_open(ck->dir, &c));
    int n = lpx_fsdp_ckpt_param_count(c);
    info = calloc((size_t)n + 1, sizeof *info);
    seen = calloc((size_t)n + 1, sizeof *seen);
    if (!info || !seen) FAIL(LPX_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) TRY(lpx_fsdp_ckpt_param(c, i, &info[i]));
    bool qlora = o->recipe == TR_NF4_QLORA;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        TRY(check_one(ck, g, info, n, seen, P->name, "parameter", is_1d(P) ? 1 : 2, P->rows, P->cols));
        if (qlora && P->kind == TR_P_LIN) {
            char name[96];
            snprintf(name, sizeof name, "%s.lora_a", P->name);
            TRY(check_one(ck, g, info, n, seen, name, "adapter", 2, o->lora_rank, P->cols));
            snprintf(name, sizeof name, "%s.lora_b", P->name);
            TRY(check_one(ck, g, info, n, seen, name, "adapter", 2, P->rows, o->lora_rank));
        }
    }
    for (int i = 0; i < n; i++)
        if (!seen[i])
            FAIL(LPX_EINVAL, "--resume '%s': the checkpoint has parameter '%s', which this run does not (it has layers "
                 "%d, this run %d)", ck->dir, info[i].name, cc->m.layers, g->layers);
    TRY(tr_ckpt_check_arch(ck, g));
    if (cc->wrap_linear != o->wrap_linear)
        FAIL(LPX_EINVAL, "--resume '%s': the checkpoint groups its parameters by --wrap %s, this run by --wrap %s (a "
             "sharded checkpoint keeps the engine's groups)", ck->dir, cc->wrap_linear ? "linear" : "block",
             o->wrap_linear ? "linear" : "block");
out:
    free(info);
    free(seen);
    lpx_fsdp_ckpt_close(c);
    return st;
}

/* Per rank, after setup: the engine's state (every rank reads the rows of
 * its shards), then the float8-delayed slots. */
lpx_status tr_ckpt_loaded(tr_rank *R, const tr_ckpt *ck)
{
    lpx_status st = lpx_comm_barrier(R->comm);
    if (st == LPX_OK && R->rank == 0 && ck->hold) {
        /* ck is the caller's (lpx_cmd_train's) own object, shared as
         * const with the ranks; after the barrier no rank reads hold */
        tr_ckpt *own = (tr_ckpt *)ck;
        lpx_fsdp_ckpt_close(own->hold);
        own->hold = NULL;
    }
    return st;
}

lpx_status tr_ckpt_load_rank(tr_rank *R, const tr_ckpt *ck)
{
    if (!ck->sharded) return tr_ckpt_v2_load_rank(R, ck);
    lpx_status st = LPX_OK;
    lpx_fsdp_ckpt *c = NULL;
    lpx_tensor *t = NULL;
    const tr_geom *g = R->g;
    TRY(lpx_fsdp_load(R->fsdp, ck->dir));
    /* float8-delayed: the slots follow the global micro-batch index, so any
     * rank count finds its own; this rank reads only the slots it runs (the
     * files holding another rank's are not opened, so not read to verify
     * them); slots the checkpoint lacks stay fresh */
    if (R->f8state && ck->has_recipe_state) {
        int nloc = R->o->micro / R->world;
        TRY(lpx_fsdp_ckpt_open(ck->dir, &c));
        for (int p = 0; p < g->nparams; p++) {
            if (g->p[p].kind != TR_P_LIN) continue;
            for (int s = R->rank * nloc; s < (R->rank + 1) * nloc; s++) {
                lpx_float8_linear_state *S = &R->f8state[p * R->f8slots + s];
                lpx_float8_delayed *ds[3] = {S->input, S->weight, S->grad_output};
                for (int k = 0; k < 3; k++) {
                    char name[96];
                    snprintf(name, sizeof name, "f8/%s.slot%d.%s", g->p[p].name, s, state_names[k]);
                    if (!ds[k]) continue;
                    st = lpx_fsdp_ckpt_extra(c, name, 0, &t);
                    if (st == LPX_ENOTFOUND) {
                        lpx_clear_error();
                        st = LPX_OK;
                        continue;
                    }
                    if (st) goto out;
                    if (lpx_tensor_dtype(t) != LPX_U8 || !lpx_tensor_is_contiguous(t))
                        FAIL(LPX_EINVAL, "--resume '%s': '%s' is not a u8 blob", ck->dir, name);
                    st = lpx_float8_delayed_load(ds[k], lpx_tensor_data(t), (size_t)lpx_tensor_numel(t));
                    if (st != LPX_OK) {
                        char msg[512];
                        snprintf(msg, sizeof msg, "%s", lpx_last_error());
                        FAIL(st, "--resume '%s': '%s': %s", ck->dir, name, msg);
                    }
                    REL(t);
                }
            }
        }
    }
out:
    lpx_tensor_release(t);
    lpx_fsdp_ckpt_close(c);
    return st;
}
