/* Checkpoints of `lpx train`, saving: --save DIR, --save-every N
 * (tr_ckpt_check_target before the run, tr_ckpt_save on every rank). The
 * format, and reading it back (--resume), is described in ckpt.c. */
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

/* the files of the gathered format (version 2) */
static const char *const v2_files[] = {MANIFEST, "model.safetensors", "optimizer.safetensors", "recipe.safetensors"};
#define N_V2_FILES (sizeof v2_files / sizeof v2_files[0])

/* A directory lpx train wrote in the gathered format (version 2): its
 * files and nothing else. */
static bool is_v2_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return false;
    bool ok = true, manifest = false;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        bool mine = false;
        for (size_t i = 0; i < N_V2_FILES; i++) mine |= !strcmp(de->d_name, v2_files[i]);
        manifest |= !strcmp(de->d_name, MANIFEST);
        ok = mine;
    }
    closedir(d);
    return ok && manifest;
}

lpx_status tr_ckpt_check_target(const char *dir)
{
    /* a directory of the gathered format is replaced through DIR.v3
     * (tr_ckpt_save): that path must be free for a save, DIR is exchanged */
    struct stat sb;
    if (lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && is_v2_dir(dir)) {
        char v3[1300];
        snprintf(v3, sizeof v3, "%s.v3", dir);
        return lpx_fsdp_save_check(v3);
    }
    /* everything else as the library's save sees it: absent, empty or a
     * whole checkpoint; never a link; the parent writable */
    lpx_status st = lpx_fsdp_save_check(dir);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        const char *m = strncmp(msg, "lpx_fsdp_save_check: ", 21) ? msg : msg + 21;
        return lpx_error(st, "--save %s", m);
    }
    return LPX_OK;
}

/* ---- save ---- */

static cJSON *config_json(const tr_opts *o, int world, int vocab)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "recipe", tr_recipe_name(o->recipe));
    cJSON_AddNumberToObject(c, "ranks", world);
    cJSON_AddStringToObject(c, "comm", o->comm);
    cJSON_AddNumberToObject(c, "micro", o->micro);
    cJSON_AddNumberToObject(c, "batch", o->batch);
    cJSON_AddNumberToObject(c, "seq", o->seq);
    cJSON_AddNumberToObject(c, "dim", o->m.dim);
    cJSON_AddNumberToObject(c, "layers", o->m.layers);
    cJSON_AddNumberToObject(c, "heads", o->m.heads);
    cJSON_AddNumberToObject(c, "vocab", vocab);
    cJSON_AddNumberToObject(c, "kv_heads", o->m.kv_heads);
    cJSON_AddNumberToObject(c, "ffn", o->m.ffn);
    cJSON_AddBoolToObject(c, "tied", o->m.tied);
    cJSON_AddNumberToObject(c, "rope_theta", o->m.rope_theta);
    cJSON_AddNumberToObject(c, "norm_eps", o->m.norm_eps);
    cJSON *rs = cJSON_AddArrayToObject(c, "rope_llama3");   /* factor, low, high, original max positions */
    double rv[4] = {o->m.rope_factor, o->m.rope_low, o->m.rope_high, o->m.rope_orig};
    for (int i = 0; i < 4; i++) cJSON_AddItemToArray(rs, cJSON_CreateNumber(rv[i]));
    cJSON_AddStringToObject(c, "wrap", o->wrap_linear ? "linear" : "block");
    cJSON_AddNumberToObject(c, "lora_rank", o->lora_rank);
    cJSON_AddNumberToObject(c, "lora_dropout", o->lora_dropout);
    cJSON_AddNumberToObject(c, "seed", (double)o->seed);
    cJSON_AddNumberToObject(c, "eval", o->eval_batches);
    cJSON *lr = cJSON_AddObjectToObject(c, "lr_schedule");
    cJSON_AddStringToObject(lr, "kind", "linear warmup over max(steps/20, 1) steps, then cosine to 10% of peak");
    cJSON_AddNumberToObject(lr, "peak", o->lr);
    cJSON_AddNumberToObject(lr, "steps", o->steps);
    cJSON *ad = cJSON_AddObjectToObject(c, "adamw");
    cJSON_AddStringToObject(ad, "see", "tools/train/optim.c (betas 0.9, 0.95; eps 1e-8; weight decay 0.1)");
    static const char *const on[] = {"adamw", "adamw8bit", "adamw4bit", "adamw-fp8"};
    cJSON_AddStringToObject(ad, "optim", on[o->optim & 3]);
    cJSON_AddStringToObject(ad, "master", tr_master_names[o->master >= 0 && o->master < TR_MASTERS ? o->master : 0]);
    if (o->optim_block) cJSON_AddNumberToObject(ad, "block", o->optim_block);
    return c;
}

/* The trainer's record of the run: the checkpoint's user object. */
static cJSON *run_record(tr_rank *R, const tr_ckpt_info *info)
{
    const tr_opts *o = R->o;
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "format", FORMAT);
    cJSON_AddNumberToObject(root, "version", VERSION);
    cJSON_AddBoolToObject(root, "recipe_state", R->f8state != NULL);
    cJSON_AddNumberToObject(root, "step", info->step);
    cJSON_AddItemToObject(root, "config", config_json(o, R->world, info->vocab));
    char hx[17];
    cJSON *data = cJSON_AddObjectToObject(root, "data");
    cJSON_AddStringToObject(data, "path", info->data_path);
    uint64_t dh = 0, db = 0;
    if (tr_file_fnv(info->data_path, &dh, &db) == LPX_OK) {
        cJSON_AddNumberToObject(data, "bytes", (double)db);
        cJSON_AddStringToObject(data, "fnv1a64", tr_hex64(dh, hx));
    }
    cJSON_AddNumberToObject(data, "position", info->step);
    cJSON_AddStringToObject(data, "note", "batches are a function of (seed, step, micro-batch): the position is the step");
    cJSON *rng = cJSON_AddObjectToObject(root, "rng");
    cJSON_AddNumberToObject(rng, "seed", (double)o->seed);
    cJSON_AddNumberToObject(rng, "counter", info->step);
    cJSON_AddStringToObject(rng, "note", "counter-based streams: data windows and LoRA dropout masks hash (seed, step, "
                                         "micro-batch, parameter); nothing else is random after init");
    cJSON_AddNumberToObject(root, "skipped_steps", info->skipped);
    if (isfinite(info->val_start)) cJSON_AddNumberToObject(root, "val_loss_start", info->val_start);
    cJSON *hist = cJSON_AddArrayToObject(root, "history");
    for (int s = 0; s < info->step && info->hist; s++) {
        const tr_step_rec *x = &info->hist[s];
        double v[4] = {x->loss, x->tok_s, x->compute_ms, x->comm_ms};
        cJSON *row = cJSON_CreateArray();
        for (int k = 0; k < 4; k++)
            cJSON_AddItemToArray(row, isfinite(v[k]) ? cJSON_CreateNumber(v[k]) : cJSON_CreateNull());
        cJSON_AddItemToArray(hist, row);
    }
    return root;
}

/* This rank's float8-delayed training slots (the micro-batches it runs),
 * as extra tensors of u8 blobs. */
static lpx_status f8_extras(tr_rank *R, int *n, char (**names)[96], lpx_tensor ***ts)
{
    const tr_geom *g = R->g;
    int nloc = R->o->micro / R->world, cap = 0;
    *n = 0;
    for (int p = 0; p < g->nparams; p++) cap += g->p[p].kind == TR_P_LIN ? 3 * nloc : 0;
    *names = calloc((size_t)cap + 1, sizeof **names);
    *ts = calloc((size_t)cap + 1, sizeof **ts);
    if (!*names || !*ts) return lpx_error(LPX_ENOMEM, "checkpoint: out of memory");
    for (int j = 0; j < nloc; j++) {
        int slot = R->rank * nloc + j;
        for (int p = 0; p < g->nparams; p++) {
            if (g->p[p].kind != TR_P_LIN) continue;
            lpx_float8_linear_state *s = &R->f8state[p * R->f8slots + slot];
            lpx_float8_delayed *ds[3] = {s->input, s->weight, s->grad_output};
            for (int k = 0; k < 3; k++) {
                if (!ds[k]) continue;
                size_t need = 0;
                lpx_status st = lpx_float8_delayed_save(ds[k], NULL, 0, &need);
                int64_t shape[1] = {(int64_t)need};
                if (!st) st = lpx_empty(1, shape, LPX_U8, lpx_cpu(), &(*ts)[*n]);
                if (!st) st = lpx_float8_delayed_save(ds[k], lpx_tensor_data((*ts)[*n]), need, &need);
                if (st) return st;
                snprintf((*names)[*n], sizeof **names, "f8/%s.slot%d.%s", g->p[p].name, slot, state_names[k]);
                (*n)++;
            }
        }
    }
    return LPX_OK;
}

lpx_status tr_ckpt_save(tr_rank *R, const tr_ckpt_info *info)
{
    lpx_status st = LPX_OK;
    char *user = NULL, (*names)[96] = NULL, tmp[1300], parent[1200];
    const char **np = NULL;
    lpx_tensor **ts = NULL;
    int n = 0;
    cJSON *rec = NULL;
    const char *dir = info->dir;
    tr_reshard_all(R);
    if (R->rank == 0) {
        rec = run_record(R, info);
        user = rec ? cJSON_PrintUnformatted(rec) : NULL;
        if (!user) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
    }
    if (R->f8state) TRY(f8_extras(R, &n, &names, &ts));
    np = calloc((size_t)n + 1, sizeof *np);
    if (!np) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; i < n; i++) np[i] = names[i];
    /* a directory of the gathered format is replaced by exchanging it with
     * the new checkpoint written beside it (one atomic rename) */
    bool v2 = is_v2_dir(dir);
    if (v2) {
        snprintf(tmp, sizeof tmp, "%s.v3", dir);
        dir = tmp;
    }
    lpx_fsdp_ckpt_opts opts = {.struct_size = sizeof opts, .user_json = user, .nextra = n, .extra_names = np,
                               .extra = ts};
    TRY(lpx_fsdp_save_ex(R->fsdp, dir, &opts));
    if (v2) {
        int32_t mine = LPX_OK, first = LPX_OK;
        if (R->rank == 0) {
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, info->dir, RENAME_EXCHANGE) != 0) {
                mine = lpx_error(LPX_EIO, "checkpoint: cannot exchange '%s' with '%s': %s", tmp, info->dir,
                                 strerror(errno));
            } else {
                /* the old checkpoint now sits at DIR.v3: remove its files */
                char p[1400];
                for (size_t i = 0; i < N_V2_FILES; i++) {
                    snprintf(p, sizeof p, "%s/%s", tmp, v2_files[i]);
                    unlink(p);
                }
                rmdir(tmp);
                snprintf(parent, sizeof parent, "%s", info->dir);
                char *s = strrchr(parent, '/');
                if (s && s != parent) *s = 0;
                else snprintf(parent, sizeof parent, "%s", s ? "/" : ".");
                int fd = open(parent, O_RDONLY | O_DIRECTORY);
                if (fd >= 0) {
                    (void)fsync(fd);
                    close(fd);
                }
            }
        }
        int32_t *all = malloc(sizeof(int32_t) * (size_t)R->world);
        if (!all) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
        st = lpx_comm_all_gather_buf(R->comm, &mine, all, sizeof mine);
        first = all[0];
        free(all);
        if (st == LPX_OK && first != LPX_OK && R->rank != 0)
            st = lpx_error((lpx_status)first, "checkpoint '%s' not written (rank 0 failed)", info->dir);
        else if (mine != LPX_OK)
            st = (lpx_status)mine;
    }
out:
    for (int i = 0; ts && i < n; i++) lpx_tensor_release(ts[i]);
    free(ts);
    free(names);
    free(np);
    cJSON_free(user);
    cJSON_Delete(rec);
    return st;
}
