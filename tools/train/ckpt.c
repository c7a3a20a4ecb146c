/* Checkpoints of `lpx train`: --save DIR, --save-every N, --resume DIR.
 *
 * A checkpoint is a directory of safetensors files and a manifest:
 *   model.safetensors      every parameter's full f32 weights, gathered
 *                          from the shards (the masters, whatever the
 *                          recipe puts on the wire; nf4-qlora: the f32
 *                          base its NF4 weights are quantized from, and
 *                          the adapters NAME.lora_a / NAME.lora_b)
 *   optimizer.safetensors  AdamW's m and v of every trainable parameter,
 *                          full shape, f32 (NAME.exp_avg, NAME.exp_avg_sq);
 *                          each one's step count in __metadata__ (NAME.step)
 *   recipe.safetensors     float8-delayed only: the delayed-scaling states
 *                          of every linear and micro-batch slot
 *                          (NAME.slotS.input|weight|grad_output: u8 blobs
 *                          of lpx_float8_delayed_save: history, scale, steps)
 *   manifest.json          written last, covered by its own checksum (the
 *                          "checksum" field: FNV-1a 64 of the file with
 *                          that field's digits as zeros): format and version, the step, the
 *                          run configuration, the data position and random
 *                          state, the loss history, and each file's size
 *                          and FNV-1a 64 checksum
 * Gathered full-shape tensors make a checkpoint independent of the rank
 * count and of the wire format, so it resumes under another world size
 * or another dense-master recipe (bf16, float8-*, mx*).
 *
 * Atomicity: rank 0 writes DIR.tmp-PID-N/ (each file fsync'd, the manifest
 * last, the directory fsync'd), then renames it to DIR; an existing DIR is
 * exchanged with it in one renameat2(RENAME_EXCHANGE) and removed after.
 * DIR is therefore the previous complete checkpoint or the new one, never
 * a mix; an interrupted save leaves a DIR.tmp-* without effect. Resume
 * refuses a directory without a manifest, or with a file whose size or
 * checksum differs from the manifest's. */
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
#include "lpx/safetensors.h"

#define FORMAT "lpx-train-checkpoint"
#define VERSION 2  /* 2: the Llama 3 model (rope, GQA, ffn, tied head; no position embedding) */
#define MODEL "model.safetensors"
#define OPTIM "optimizer.safetensors"
#define RECIPE "recipe.safetensors"
#define MANIFEST "manifest.json"

static const char *const state_names[3] = {"input", "weight", "grad_output"};

/* ---- the trainable parameters, as the engine holds them ---- */

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

static char *shape_str(const int64_t *s, int nd, char *buf, size_t n)
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

/* ---- save ---- */

typedef struct entries {
    int n, cap;
    char (*names)[80];
    lpx_tensor **t;
} entries;

static lpx_status ent_add(entries *e, const char *name, lpx_tensor *t)
{
    if (e->n == e->cap) {
        int cap = e->cap ? 2 * e->cap : 64;
        char (*nn)[80] = realloc(e->names, sizeof *nn * (size_t)cap);
        if (nn) e->names = nn;
        lpx_tensor **nt = realloc(e->t, sizeof *nt * (size_t)cap);
        if (nt) e->t = nt;
        if (!nn || !nt) {
            lpx_tensor_release(t);
            return lpx_error(LPX_ENOMEM, "checkpoint: out of memory");
        }
        e->cap = cap;
    }
    snprintf(e->names[e->n], sizeof e->names[0], "%s", name);
    e->t[e->n++] = t;
    return LPX_OK;
}

static void ent_free(entries *e)
{
    for (int i = 0; i < e->n; i++) lpx_tensor_release(e->t[i]);
    free(e->names);
    free(e->t);
    memset(e, 0, sizeof *e);
}

static lpx_status ent_save(const char *path, const entries *e, int nmeta, const lpx_safetensors_kv *meta)
{
    const char **names = malloc(sizeof *names * (size_t)(e->n + 1));
    if (!names) return lpx_error(LPX_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; i < e->n; i++) names[i] = e->names[i];
    lpx_status st = lpx_safetensors_save(path, e->n, names, e->t, nmeta, meta);
    free(names);
    return st;
}

/* Gathers a Shard(0) f32 tensor; the writer (out_e non-NULL) gets it as an
 * entry of out_e named `name`. */
static lpx_status gather_entry(tr_rank *R, const char *name, const lpx_tensor *local, int64_t rows, int64_t cols,
                               int ndim, entries *out_e)
{
    lpx_status st = LPX_OK;
    lpx_tensor *full = NULL;
    if (lpx_tensor_kind(local) || lpx_tensor_dtype(local) != LPX_F32 || !lpx_tensor_is_contiguous(local))
        FAIL(LPX_EINTERNAL, "checkpoint: the local shard of %s is not a contiguous f32 tensor", name);
    int64_t lrows = lpx_tensor_ndim(local) ? lpx_tensor_shape(local)[0] : 0;
    if (out_e) {
        int64_t shape[2] = {rows, cols};
        TRY(lpx_empty(ndim, shape, LPX_F32, lpx_cpu(), &full));
    }
    TRY(tr_gather_rows(R, lpx_tensor_data(local), lrows, rows, cols, full ? lpx_tensor_data(full) : NULL));
    if (out_e) {
        st = ent_add(out_e, name, full);
        full = NULL;
    }
out:
    lpx_tensor_release(full);
    return st;
}

static lpx_status f32_entry(const char *name, const float *v, int64_t rows, int64_t cols, int ndim, entries *e)
{
    lpx_tensor *t = NULL;
    int64_t shape[2] = {rows, cols};
    lpx_status st = lpx_empty(ndim, shape, LPX_F32, lpx_cpu(), &t);
    if (st != LPX_OK) return st;
    memcpy(lpx_tensor_data(t), v, sizeof(float) * (size_t)(rows * cols));
    return ent_add(e, name, t);
}

static lpx_status fsync_path(const char *path, bool dir)
{
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return lpx_error(LPX_EIO, "checkpoint: cannot open '%s' to fsync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* some file systems cannot fsync a directory (EINVAL): nothing to do there */
    if (rc && !(dir && e == EINVAL)) return lpx_error(LPX_EIO, "checkpoint: fsync '%s': %s", path, strerror(e));
    return LPX_OK;
}

/* A flat directory: removes its files, then it. */
static void remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        char p[2200];
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* An existing DIR may be replaced only if it is empty or holds nothing
 * but checkpoint files (no user data is ever deleted). */
static bool replaceable(const char *path)
{
    static const char *const ours[] = {MANIFEST, MODEL, OPTIM, RECIPE};
    DIR *d = opendir(path);
    if (!d) return false;
    bool ok = true;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        bool mine = false;
        for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++) mine |= !strcmp(de->d_name, ours[i]);
        ok = mine;
    }
    closedir(d);
    return ok;
}

lpx_status tr_ckpt_check_target(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) return LPX_OK;   /* made at the first save */
    if (!S_ISDIR(sb.st_mode) || !replaceable(dir))
        return lpx_error(LPX_EINVAL, "--save '%s': it exists and is not an lpx train checkpoint (%s); a save replaces "
                         "the directory, so choose another", dir, S_ISDIR(sb.st_mode) ? "it holds other files" : "a file");
    return LPX_OK;
}

static void parent_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    size_t k = strlen(out);
    while (k > 1 && out[k - 1] == '/') out[--k] = 0;
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, n, ".");
    else if (s == out) out[1] = 0;
    else *s = 0;
}

static char *hex64(uint64_t v, char *buf)
{
    snprintf(buf, 17, "%016" PRIx64, v);
    return buf;
}

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
    return c;
}

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

/* the 16 digits of the text's checksum field, or NULL (exactly one, a
 * string of 16 characters) */
static char *sum_digits(char *text)
{
    char *k = strstr(text, SUM_KEY);
    if (!k || strstr(k + 1, SUM_KEY)) return NULL;
    char *q = strchr(k + strlen(SUM_KEY), '"');
    if (!q || strlen(q) < 18 || q[17] != '"') return NULL;
    return q + 1;
}

static lpx_status write_manifest(const char *path, cJSON *root)
{
    cJSON_AddStringToObject(root, "checksum", zeros16);
    char *text = cJSON_Print(root);
    if (!text) return lpx_error(LPX_ENOMEM, "checkpoint: out of memory for the manifest");
    char *d = sum_digits(text);
    if (!d) {
        cJSON_free(text);
        return lpx_error(LPX_EINTERNAL, "checkpoint: the manifest's checksum field is not where it is expected");
    }
    /* over the bytes the file will hold: the text and its final newline */
    char hx[17];
    uint64_t h = (fnv_mem(text, strlen(text)) ^ (unsigned char)'\n') * 0x100000001B3ull;
    memcpy(d, hex64(h, hx), 16);
    lpx_status st = LPX_OK;
    FILE *f = fopen(path, "w");
    if (!f) {
        st = lpx_error(LPX_EIO, "checkpoint: cannot write '%s': %s", path, strerror(errno));
    } else {
        bool bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
        bad |= fflush(f) != 0;
        bad |= fsync(fileno(f)) != 0;
        bad |= fclose(f) != 0;
        if (bad) st = lpx_error(LPX_EIO, "checkpoint: cannot write '%s': %s", path, strerror(errno));
    }
    cJSON_free(text);
    return st;
}

/* rank 0: the files into a temporary directory, then renamed to DIR */
static lpx_status write_dir(tr_rank *R, const tr_ckpt_info *info, entries *model, entries *optim, int noptmeta,
                            const lpx_safetensors_kv *optmeta, entries *recipe, int nrecmeta,
                            const lpx_safetensors_kv *recmeta)
{
    static int counter;
    lpx_status st = LPX_OK;
    const tr_opts *o = R->o;
    char tmp[1200], path[1400], parent[1200];
    cJSON *root = NULL;
    bool made = false;
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%d", info->dir, (long)getpid(), counter++);
    struct stat sb;
    if (stat(info->dir, &sb) == 0 && (!S_ISDIR(sb.st_mode) || !replaceable(info->dir)))
        FAIL(LPX_EINVAL, "checkpoint: refusing to replace '%s': it exists and is not an lpx train checkpoint "
             "(it holds other files)", info->dir);
    if (mkdir(tmp, 0777) != 0) FAIL(LPX_EIO, "checkpoint: cannot create '%s': %s", tmp, strerror(errno));
    made = true;

    const char *files[3] = {MODEL, OPTIM, RECIPE};
    int nfiles = recipe ? 3 : 2;
    snprintf(path, sizeof path, "%s/%s", tmp, MODEL);
    lpx_safetensors_kv mm[1] = {{"lpx_train", "model: full f32 weights by parameter name"}};
    TRY(ent_save(path, model, 1, mm));
    snprintf(path, sizeof path, "%s/%s", tmp, OPTIM);
    TRY(ent_save(path, optim, noptmeta, optmeta));
    if (recipe) {
        snprintf(path, sizeof path, "%s/%s", tmp, RECIPE);
        TRY(ent_save(path, recipe, nrecmeta, recmeta));
    }

    /* the manifest, last: a directory without one is not a checkpoint */
    root = cJSON_CreateObject();
    if (!root) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
    cJSON_AddStringToObject(root, "format", FORMAT);
    cJSON_AddNumberToObject(root, "version", VERSION);
    cJSON_AddNumberToObject(root, "step", info->step);
    cJSON_AddItemToObject(root, "config", config_json(o, R->world, info->vocab));
    char hx[17];
    cJSON *data = cJSON_AddObjectToObject(root, "data");
    cJSON_AddStringToObject(data, "path", info->data_path);
    uint64_t dh = 0, db = 0;
    if (tr_file_fnv(info->data_path, &dh, &db) == LPX_OK) {
        cJSON_AddNumberToObject(data, "bytes", (double)db);
        cJSON_AddStringToObject(data, "fnv1a64", hex64(dh, hx));
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
    cJSON *fl = cJSON_AddArrayToObject(root, "files");
    for (int i = 0; i < nfiles; i++) {
        uint64_t h, n;
        snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
        TRY(tr_file_fnv(path, &h, &n));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", files[i]);
        cJSON_AddNumberToObject(e, "bytes", (double)n);
        cJSON_AddStringToObject(e, "fnv1a64", hex64(h, hx));
        cJSON_AddItemToArray(fl, e);
    }
    snprintf(path, sizeof path, "%s/%s", tmp, MANIFEST);
    TRY(write_manifest(path, root));
    TRY(fsync_path(tmp, true));

    /* into place: DIR is the old checkpoint or the new one at every instant */
    if (stat(info->dir, &sb) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, info->dir, RENAME_EXCHANGE) == 0) {
            remove_dir(tmp); /* the previous checkpoint, now under the temporary name */
        } else {
            /* no RENAME_EXCHANGE here: move the old one aside first (a crash
             * between the renames leaves DIR.old-* holding the checkpoint) */
            char old[1300];
            snprintf(old, sizeof old, "%s.old-%ld", info->dir, (long)getpid());
            if (rename(info->dir, old) != 0 || rename(tmp, info->dir) != 0)
                FAIL(LPX_EIO, "checkpoint: cannot rename '%s' to '%s': %s", tmp, info->dir, strerror(errno));
            remove_dir(old);
        }
    } else if (rename(tmp, info->dir) != 0) {
        FAIL(LPX_EIO, "checkpoint: cannot rename '%s' to '%s': %s", tmp, info->dir, strerror(errno));
    }
    made = false;
    parent_of(info->dir, parent, sizeof parent);
    TRY(fsync_path(parent, true));
out:
    if (made) remove_dir(tmp);
    cJSON_Delete(root);
    return st;
}

lpx_status tr_ckpt_save(tr_rank *R, const tr_ckpt_info *info)
{
    lpx_status st = LPX_OK, wst = LPX_OK;
    const tr_geom *g = R->g;
    bool writer = R->rank == 0, qlora = R->recipe == TR_NF4_QLORA;
    entries model = {0}, optim = {0}, recipe = {0};
    tr_tparam *tp = calloc((size_t)g->nparams * 2 + 1, sizeof *tp);
    char (*stepv)[24] = calloc((size_t)g->nparams * 2 + 1, sizeof *stepv);
    char (*stepk)[80] = calloc((size_t)g->nparams * 2 + 1, sizeof *stepk);
    lpx_safetensors_kv *meta = calloc((size_t)g->nparams * 2 + 2, sizeof *meta);
    unsigned char *blobs = NULL, *all = NULL;
    lpx_tensor *m = NULL, *v = NULL;
    int nmeta = 0;
    if (!tp || !stepv || !stepk || !meta) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
    int nt = trainables(R, tp);

    /* model.safetensors: the weights, full shape */
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (qlora) {
            /* the frozen base every rank holds whole */
            if (writer) TRY(f32_entry(P->name, info->weights[p], P->rows, P->cols, is_1d(P) ? 1 : 2, &model));
        } else {
            TRY(gather_entry(R, P->name, R->master[p], P->rows, P->cols, is_1d(P) ? 1 : 2, writer ? &model : NULL));
        }
    }
    for (int i = 0; i < nt && qlora; i++) {
        lpx_tensor *loc = lpx_fsdp_param_local(R->grp[g->p[tp[i].p].group], tp[i].idx);
        TRY(gather_entry(R, tp[i].name, loc, tp[i].rows, tp[i].cols, 2, writer ? &model : NULL));
    }

    /* optimizer.safetensors: AdamW m and v, full shape; steps in the metadata */
    for (int i = 0; i < nt; i++) {
        char name[96];
        int64_t step = 0;
        TRY(lpx_fsdp_param_adamw_state(R->grp[g->p[tp[i].p].group], tp[i].idx, &m, &v, &step));
        snprintf(name, sizeof name, "%s.exp_avg", tp[i].name);
        TRY(gather_entry(R, name, m, tp[i].rows, tp[i].cols, tp[i].ndim, writer ? &optim : NULL));
        snprintf(name, sizeof name, "%s.exp_avg_sq", tp[i].name);
        TRY(gather_entry(R, name, v, tp[i].rows, tp[i].cols, tp[i].ndim, writer ? &optim : NULL));
        REL(m);
        REL(v);
        snprintf(stepk[nmeta], sizeof stepk[0], "%s.step", tp[i].name);
        snprintf(stepv[nmeta], sizeof stepv[0], "%lld", (long long)step);
        meta[nmeta].key = stepk[nmeta];
        meta[nmeta].value = stepv[nmeta];
        nmeta++;
    }

    /* recipe.safetensors (float8-delayed): every training slot's states.
     * Slot s belongs to the rank that runs micro-batch s; each rank packs
     * its slots as records [u32 size][blob, padded to B] and one
     * all-gather puts them in slot order. */
    char rmeta_v[2][24];
    lpx_safetensors_kv rmeta[3];
    int nrmeta = 0;
    if (R->f8state) {
        int nloc = R->o->micro / R->world, nlin = 0;
        size_t B = 0;
        for (int p = 0; p < g->nparams; p++) {
            if (g->p[p].kind != TR_P_LIN) continue;
            nlin++;
            lpx_float8_linear_state *s = &R->f8state[p * R->f8slots];
            lpx_float8_delayed *ds[3] = {s->input, s->weight, s->grad_output};
            for (int k = 0; k < 3; k++) {
                size_t need = 0;
                if (ds[k]) TRY(lpx_float8_delayed_save(ds[k], NULL, 0, &need));
                B = need > B ? need : B;
            }
        }
        size_t rec = 4 + B, block = rec * 3 * (size_t)nlin * (size_t)nloc;
        blobs = calloc(block + 1, 1);
        all = writer ? calloc(block * (size_t)R->world + 1, 1) : malloc(block * (size_t)R->world + 1);
        if (!blobs || !all) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
        size_t at = 0;
        for (int j = 0; j < nloc; j++) {
            int slot = R->rank * nloc + j;
            for (int p = 0; p < g->nparams; p++) {
                if (g->p[p].kind != TR_P_LIN) continue;
                lpx_float8_linear_state *s = &R->f8state[p * R->f8slots + slot];
                lpx_float8_delayed *ds[3] = {s->input, s->weight, s->grad_output};
                for (int k = 0; k < 3; k++, at += rec) {
                    size_t size = 0;
                    if (ds[k]) TRY(lpx_float8_delayed_save(ds[k], blobs + at + 4, B, &size));
                    uint32_t sz = (uint32_t)size;
                    memcpy(blobs + at, &sz, 4);
                }
            }
        }
        TRY(lpx_comm_all_gather_buf(R->comm, blobs, all, block));
        if (writer) {
            at = 0;
            for (int r = 0; r < R->world; r++)
                for (int j = 0; j < nloc; j++)
                    for (int p = 0; p < g->nparams; p++) {
                        if (g->p[p].kind != TR_P_LIN) continue;
                        for (int k = 0; k < 3; k++, at += rec) {
                            uint32_t sz;
                            memcpy(&sz, all + at, 4);
                            if (!sz) continue;
                            char name[96];
                            snprintf(name, sizeof name, "%s.slot%d.%s", g->p[p].name, r * nloc + j, state_names[k]);
                            int64_t shape[1] = {sz};
                            lpx_tensor *t = NULL;
                            TRY(lpx_empty(1, shape, LPX_U8, lpx_cpu(), &t));
                            memcpy(lpx_tensor_data(t), all + at + 4, sz);
                            TRY(ent_add(&recipe, name, t));
                        }
                    }
        }
        snprintf(rmeta_v[0], sizeof rmeta_v[0], "%d", R->o->micro);
        snprintf(rmeta_v[1], sizeof rmeta_v[1], "%d", R->f8r.delayed.history_len);
        rmeta[0] = (lpx_safetensors_kv){"slots", rmeta_v[0]};
        rmeta[1] = (lpx_safetensors_kv){"history_len", rmeta_v[1]};
        rmeta[2] = (lpx_safetensors_kv){"format", "lpx_float8_delayed_save blobs: NAME.slotS.input|weight|grad_output"};
        nrmeta = 3;
    }

    if (writer) wst = write_dir(R, info, &model, &optim, nmeta, meta, R->f8state ? &recipe : NULL, nrmeta, rmeta);
    /* every rank learns rank 0's outcome (its message is the one reported) */
    int32_t mine = (int32_t)wst, *sts = malloc(sizeof(int32_t) * (size_t)R->world);
    if (!sts) FAIL(LPX_ENOMEM, "checkpoint: out of memory");
    char msg[1024];
    if (wst != LPX_OK) snprintf(msg, sizeof msg, "%s", lpx_last_error());
    st = lpx_comm_all_gather_buf(R->comm, &mine, sts, sizeof mine);
    int32_t w0 = sts[0];
    free(sts);
    if (wst != LPX_OK) st = lpx_error(wst, "%s", msg);
    else if (st == LPX_OK && w0 != LPX_OK)
        st = lpx_error((lpx_status)w0, "checkpoint '%s' not written (rank 0 failed)", info->dir);
out:
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    ent_free(&model);
    ent_free(&optim);
    ent_free(&recipe);
    free(tp);
    free(stepv);
    free(stepk);
    free(meta);
    free(blobs);
    free(all);
    return st;
}

/* ---- resume ---- */

static bool json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= (double)lo && j->valuedouble <= (double)hi) ||
        j->valuedouble != floor(j->valuedouble))
        return false;
    *out = (int64_t)j->valuedouble;
    return true;
}

static const char *json_str(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

void tr_ckpt_free(tr_ckpt *ck)
{
    free(ck->hist);
    ck->hist = NULL;
}

lpx_status tr_ckpt_open(const char *dir, tr_ckpt *ck)
{
    lpx_status st = LPX_OK;
    char path[1400];
    char *text = NULL;
    cJSON *root = NULL;
    memset(ck, 0, sizeof *ck);
    ck->val_start = NAN;
    snprintf(ck->dir, sizeof ck->dir, "%s", dir);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        FAIL(LPX_ENOTFOUND, "--resume '%s': no such checkpoint directory", dir);
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    size_t n = 0;
    st = tr_read_file(path, 64u << 20, &text, &n);
    if (st == LPX_ENOTFOUND)
        FAIL(LPX_ENOTFOUND, "--resume '%s': no %s: not a complete lpx train checkpoint (a save writes its manifest "
             "last; an interrupted one leaves none)", dir, MANIFEST);
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
        hex64(fnv_mem(text, (size_t)n), hx);
        memcpy(d, want, 16);
        if (strcmp(hx, want))
            FAIL(LPX_EINVAL, "--resume '%s': %s has checksum (FNV-1a 64) %s, it records %s: the manifest was "
                 "edited or damaged", dir, MANIFEST, hx, want);
    }
    root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) FAIL(LPX_EINVAL, "--resume '%s': %s is not valid JSON", dir, MANIFEST);
    const char *fmt = json_str(root, "format");
    int64_t ver = 0, step = 0, x = 0;
    if (!fmt || strcmp(fmt, FORMAT) || !json_int(root, "version", 0, 1000, &ver))
        FAIL(LPX_EINVAL, "--resume '%s': %s is not an lpx train checkpoint manifest", dir, MANIFEST);
    if (ver != VERSION)
        FAIL(LPX_EINVAL, "--resume '%s': manifest version %lld; this lpx reads version %d", dir, (long long)ver, VERSION);
    if (!json_int(root, "step", 1, 1000000, &step)) FAIL(LPX_EINVAL, "--resume '%s': manifest: bad \"step\"", dir);
    ck->step = (int)step;

    /* every file the manifest lists, whole and unchanged */
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files)) FAIL(LPX_EINVAL, "--resume '%s': manifest: no \"files\"", dir);
    bool has_model = false, has_optim = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        const char *name = json_str(e, "name"), *hx = json_str(e, "fnv1a64");
        int64_t bytes;
        if (!name || !hx || strchr(name, '/') || !json_int(e, "bytes", 0, INT64_C(1) << 52, &bytes))
            FAIL(LPX_EINVAL, "--resume '%s': manifest: a malformed \"files\" entry", dir);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        uint64_t h, nb;
        if (tr_file_fnv(path, &h, &nb) != LPX_OK)
            FAIL(LPX_EINVAL, "--resume '%s': %s is missing: the checkpoint is incomplete", dir, name);
        char want[17];
        if (nb != (uint64_t)bytes)
            FAIL(LPX_EINVAL, "--resume '%s': %s has %llu bytes, the manifest records %lld: the checkpoint is damaged",
                 dir, name, (unsigned long long)nb, (long long)bytes);
        if (strcmp(hex64(h, want), hx))
            FAIL(LPX_EINVAL, "--resume '%s': %s has checksum (FNV-1a 64) %s, the manifest records %s: the checkpoint "
                 "is damaged", dir, name, want, hx);
        has_model |= !strcmp(name, MODEL);
        has_optim |= !strcmp(name, OPTIM);
        ck->has_recipe_state |= !strcmp(name, RECIPE);
    }
    if (!has_model || !has_optim)
        FAIL(LPX_EINVAL, "--resume '%s': the manifest lists no %s", dir, has_model ? OPTIM : MODEL);

    /* the run configuration */
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *lr = cJSON_GetObjectItemCaseSensitive(c, "lr_schedule");
    const char *rn = json_str(c, "recipe"), *wrap = json_str(c, "wrap"), *comm = json_str(c, "comm");
    int64_t v[11] = {0};
    static const char *const keys[10] = {"ranks", "micro", "batch", "seq", "dim", "layers", "heads", "vocab",
                                         "lora_rank", "seed"};
    bool ok = rn && tr_recipe_from_name(rn) >= 0 && wrap && comm && cJSON_IsObject(lr);
    for (int k = 0; k < 10 && ok; k++) ok = json_int(c, keys[k], 0, 2147483647, &v[k]);
    if (ok && !json_int(c, "eval", 1, 100000, &v[10])) v[10] = 0; /* optional: 0 keeps the run's */
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(lr, "peak"),
                *drop = cJSON_GetObjectItemCaseSensitive(c, "lora_dropout");
    ok = ok && cJSON_IsNumber(peak) && cJSON_IsNumber(drop) && json_int(lr, "steps", 1, 1000000, &x);
    if (!ok) FAIL(LPX_EINVAL, "--resume '%s': manifest: a malformed \"config\"", dir);
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
    if (!json_int(c, "kv_heads", 1, 1 << 20, &kvh) || !json_int(c, "ffn", 1, 1 << 24, &ffn) || !cJSON_IsNumber(theta) ||
        !cJSON_IsNumber(eps) || !cJSON_IsBool(tied) || !cJSON_IsArray(rs) || cJSON_GetArraySize(rs) != 4)
        FAIL(LPX_EINVAL, "--resume '%s': manifest: a malformed \"config\" (the model's kv_heads, ffn, tied, rope_theta, "
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

    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const char *dp = json_str(data, "path"), *dh = json_str(data, "fnv1a64");
    int64_t dbytes = 0;
    if (dp) snprintf(ck->data_path, sizeof ck->data_path, "%s", dp);
    if (dh && json_int(data, "bytes", 0, INT64_C(1) << 52, &dbytes)) {
        ck->data_fnv = strtoull(dh, NULL, 16);
        ck->data_bytes = (uint64_t)dbytes;
    }
    int64_t sk = 0;
    if (json_int(root, "skipped_steps", 0, 1000000, &sk)) ck->skipped = (int)sk;
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
        ck->hist[ck->nhist++] = (tr_step_rec){vals[0], vals[1], vals[2], vals[3]};
    }
out:
    free(text);
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
    if (ck->step >= o->steps)
        return bad_resume("--resume '%s': the checkpoint is at step %d; --steps %d leaves nothing to run", ck->dir,
                          ck->step, o->steps);
    if (o->stop_after && o->stop_after <= ck->step)
        return bad_resume("--resume '%s': the checkpoint is at step %d; --stop-after %d is not beyond it", ck->dir,
                          ck->step, o->stop_after);
    return 0;
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
                       lpx_dtype_name(lpx_tensor_dtype(*out)), shape_str(s, lpx_tensor_ndim(*out), a, sizeof a),
                       shape_str(want, ndim, b, sizeof b), c->m.dim, c->m.layers, c->m.heads, c->seq, ck->vocab,
                       c->lora_rank);
        REL(*out);
    }
    return st;
}

lpx_status tr_ckpt_load_weights(const tr_ckpt *ck, const tr_geom *g, const tr_opts *o, float **w)
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
                 "layers %d; this run dim %d, layers %d)", ck->dir, P->name, shape_str(want, is_1d(P) ? 1 : 2, b,
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
    /* the same shapes with other heads would be another model */
    if (c->m.heads != g->heads)
        FAIL(LPX_EINVAL, "--resume '%s': the checkpoint's model has %d attention heads, this run %d (--heads)", ck->dir,
             c->m.heads, g->heads);
    if (c->m.rope_theta != g->a.rope_theta || c->m.rope_factor != g->a.rope_factor || c->m.tied != g->tied)
        FAIL(LPX_EINVAL, "--resume '%s': the checkpoint's model has rope_theta %g%s%s; this run %g%s%s", ck->dir,
             c->m.rope_theta, c->m.rope_factor != 0 ? " with llama3 scaling" : "", c->m.tied ? ", a tied head" : "",
             g->a.rope_theta, g->a.rope_factor != 0 ? " with llama3 scaling" : "", g->tied ? ", a tied head" : "");
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

lpx_status tr_ckpt_load_rank(tr_rank *R, const tr_ckpt *ck)
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
