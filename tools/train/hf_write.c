/* Hugging Face checkpoints, writing: --save-hf DIR (tr_hf_make_dir,
 * tr_hf_export, tr_hf_write_config) and the other files of --init DIR it
 * copies (tr_hf_check_copy); the formats are described in hf_read.c,
 * which also holds tr_hf_import (--init DIR read by rows on the ranks). */
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

/* ---- out ---- */

static cJSON *config_of(const tr_geom *g)
{
    const tr_arch *a = &g->a;
    cJSON *c = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "llama");
    cJSON_AddNumberToObject(c, "hidden_size", a->dim);
    cJSON_AddNumberToObject(c, "intermediate_size", a->ffn);
    cJSON_AddNumberToObject(c, "num_hidden_layers", a->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", a->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", a->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", a->dim / a->heads);
    cJSON_AddNumberToObject(c, "vocab_size", a->vocab);
    cJSON_AddNumberToObject(c, "rms_norm_eps", a->norm_eps);
    cJSON_AddNumberToObject(c, "rope_theta", a->rope_theta);
    if (a->rope_factor != 0) {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", a->rope_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", a->rope_low);
        cJSON_AddNumberToObject(rs, "high_freq_factor", a->rope_high);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", a->rope_orig);
    } else {
        cJSON_AddNullToObject(c, "rope_scaling");
    }
    /* the preset's published value; else what the rope scaling spans, or
     * the trained length (at least 2048) */
    int maxpos = a->max_pos > 0 ? a->max_pos
                 : a->rope_factor != 0 ? (int)(a->rope_orig * a->rope_factor) : (g->seq > 2048 ? g->seq : 2048);
    cJSON_AddNumberToObject(c, "max_position_embeddings", maxpos);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", a->tied);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddBoolToObject(c, "attention_bias", false);
    cJSON_AddBoolToObject(c, "mlp_bias", false);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddStringToObject(c, "torch_dtype", "float32");
    cJSON_AddBoolToObject(c, "use_cache", true);
    return c;
}

/* mkdir -p */
static bool make_dirs(const char *dir)
{
    char p[1024];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) return false;
            *s = '/';
        }
    return mkdir(p, 0777) == 0 || errno == EEXIST;
}

lpx_status tr_hf_make_dir(const char *dir)
{
    if (!make_dirs(dir)) return lpx_error(LPX_EIO, "--save-hf: cannot create '%s': %s", dir, strerror(errno));
    return LPX_OK;
}

lpx_status tr_hf_export(tr_rank *R, const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    lpx_safetensors_kv meta = {"format", "pt"};
    return lpx_fsdp_export(R->fsdp, path, LPX_F32, tr_hf_group_name, R, 1, &meta);
}

/* a model file of DIR that is a regular file (lstat: a symbolic link is
 * not followed, nor removed) */
static bool regular_at(const char *dir, const char *file, char *path, size_t n)
{
    struct stat sb;
    snprintf(path, n, "%s/%s", dir, file);
    return lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* After the new model.safetensors and config.json are in place: an earlier
 * sharded model's index and the shards it names go, else a reader that
 * takes the index (lpx did) would load the old weights. Only those model
 * files, only regular ones; tokenizer files, a README, anything else of
 * the folder stay. Shards first, the index last: a run cut short leaves an
 * index beside model.safetensors, which loaders (lpx, transformers) pass
 * over for the single file. */
static lpx_status remove_stale(const char *dir)
{
    char index[1200], path[1400];
    if (!regular_at(dir, "model.safetensors.index.json", index, sizeof index)) return LPX_OK;
    cJSON *root = NULL;
    if (tr_json_read(index, &root) == LPX_OK) {   /* unreadable: the index alone goes */
        const cJSON *e, *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        if (!cJSON_IsObject(map)) map = NULL;
        cJSON_ArrayForEach(e, map) {
            const char *f = cJSON_IsString(e) ? e->valuestring : "";
            size_t n = strlen(f);
            /* a shard's name: in this folder, *.safetensors, not the new file */
            bool shard = n > 12 && !strcmp(f + n - 12, ".safetensors") && !strchr(f, '/') &&
                         strcmp(f, "model.safetensors");
            if (shard && regular_at(dir, f, path, sizeof path) && unlink(path) != 0 && errno != ENOENT) {
                lpx_status st = lpx_error(LPX_EIO, "--save-hf: cannot remove the earlier model's shard '%s': %s", path,
                                          strerror(errno));
                cJSON_Delete(root);
                return st;
            }
        }
        cJSON_Delete(root);
    }
    if (unlink(index) != 0 && errno != ENOENT)
        return lpx_error(LPX_EIO, "--save-hf: cannot remove the earlier model's index '%s': %s", index, strerror(errno));
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {   /* the removals durable too (best effort: the model is whole either way) */
        (void)fsync(dfd);
        close(dfd);
    }
    return LPX_OK;
}

/* ---- the other files of --init DIR ---- */

/* a file --save-hf copies from --init DIR: not hidden (a temporary, an
 * editor's), not config.json (written from DIR's), not weights or an index
 * of weights (lpx writes its own model.safetensors) */
static bool copied_name(const char *name)
{
    static const char *const weights[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5",
                                          ".msgpack", ".gguf", ".onnx", ".index.json"};
    size_t n = strlen(name);
    if (name[0] == '.' || !strcmp(name, "config.json")) return false;
    for (size_t i = 0; i < sizeof weights / sizeof *weights; i++) {
        size_t k = strlen(weights[i]);
        if (n >= k && !strcmp(name + n - k, weights[i])) return false;
    }
    return true;
}

/* p inside folder f (both resolved): f itself or below it */
static bool inside(const char *p, const char *f)
{
    size_t n = strlen(f);
    return f[0] && !strncmp(p, f, n) && (p[n] == '/' || (n == 1 && f[0] == '/'));
}

typedef struct hf_src {
    char dir[PATH_MAX];     /* --init DIR, resolved */
    char blobs[PATH_MAX];   /* a Hugging Face cache snapshot's DIR/../../blobs, resolved ("" otherwise) */
} hf_src;

static lpx_status src_open(const char *init, hf_src *s)
{
    char up[PATH_MAX + 16];
    memset(s, 0, sizeof *s);
    if (!realpath(init, s->dir))
        return lpx_error(LPX_EIO, "--init '%s': %s", init, strerror(errno));
    /* hub cache layout: models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/SHA */
    const char *rev = strrchr(s->dir, '/');
    if (rev && rev - s->dir >= 10 && !strncmp(rev - 10, "/snapshots", 10)) {
        snprintf(up, sizeof up, "%s/../../blobs", s->dir);
        if (!realpath(up, s->blobs)) s->blobs[0] = 0;
    }
    return LPX_OK;
}

/* DIR/name to copy, resolved into src: 1 a regular file of DIR (or a link
 * to one inside DIR, or in the blobs of its cache snapshot); 0 skipped
 * without a word (a folder, a file that is not copied); -1 skipped, why
 * says so (a link out of DIR, a FIFO). */
static int source_of(const hf_src *s, const char *name, char *src, size_t n, char *why, size_t wn)
{
    char path[PATH_MAX + 300];
    struct stat lb, sb;
    if (!copied_name(name)) return 0;
    snprintf(path, sizeof path, "%s/%s", s->dir, name);
    if (lstat(path, &lb) != 0 || S_ISDIR(lb.st_mode)) return 0;
    if (S_ISREG(lb.st_mode)) {
        snprintf(src, n, "%s", path);
        return 1;
    }
    if (!S_ISLNK(lb.st_mode)) {
        snprintf(why, wn, "%s: not a regular file", path);
        return -1;
    }
    char real[PATH_MAX];
    if (!realpath(path, real) || stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(why, wn, "%s: a symbolic link to no regular file", path);
        return -1;
    }
    if (!inside(real, s->dir) && !(s->blobs[0] && inside(real, s->blobs))) {
        snprintf(why, wn, "%s: a symbolic link out of the folder (to %s); links are followed only inside it", path,
                 real);
        return -1;
    }
    snprintf(src, n, "%s", real);
    return 1;
}

/* the files at a and b have the same bytes (neither is a FIFO: checked) */
static bool same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fa ? fopen(b, "rb") : NULL;
    bool same = fa && fb;
    static char ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        if (na != nb || memcmp(ba, bb, na)) same = false;
        if (na < sizeof ba) {
            same = same && !ferror(fa) && !ferror(fb);
            break;
        }
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* OUT/name against src: 1 to copy (absent), 0 nothing to do (the same
 * file, or the same bytes), else an error: a different file of the user's
 * is never overwritten, a FIFO or a folder never opened */
static lpx_status dest_state(const char *src, const char *out, const char *name, int *copy)
{
    char path[PATH_MAX + 300];
    struct stat db, sb;
    snprintf(path, sizeof path, "%s/%s", out, name);
    *copy = 0;
    if (lstat(path, &db) != 0) {
        if (errno != ENOENT) return lpx_error(LPX_EIO, "--save-hf: '%s': %s", path, strerror(errno));
        *copy = 1;
        return LPX_OK;
    }
    if (stat(path, &db) != 0 || !S_ISREG(db.st_mode))
        return lpx_error(LPX_EINVAL, "--save-hf: '%s' is not a regular file; --init's %s would be copied there", path,
                         name);
    if (stat(src, &sb) == 0 && sb.st_dev == db.st_dev && sb.st_ino == db.st_ino) return LPX_OK;
    if (sb.st_size == db.st_size && same_bytes(src, path)) return LPX_OK;
    return lpx_error(LPX_EEXIST, "--save-hf: '%s' differs from --init's '%s'; lpx does not overwrite it (remove it, or "
                     "save to another folder)", path, src);
}

/* calls fn for every file of DIR --save-hf copies (in name order, so the
 * messages are stable) */
typedef lpx_status (*hf_each_fn)(const char *src, const char *name, void *ctx);
static lpx_status each_copied(const char *init, FILE *warn, hf_each_fn fn, void *ctx)
{
    hf_src s;
    lpx_status st = src_open(init, &s);
    if (st) return st;
    struct dirent **ents = NULL;
    int n = scandir(s.dir, &ents, NULL, alphasort);
    if (n < 0) return lpx_error(LPX_EIO, "--init '%s': cannot list it: %s", init, strerror(errno));
    for (int i = 0; i < n; i++) {
        char src[PATH_MAX + 300], why[3 * PATH_MAX];
        int r = st ? 0 : source_of(&s, ents[i]->d_name, src, sizeof src, why, sizeof why);
        if (r < 0 && warn) fprintf(warn, "lpx train: warning: --save-hf will not copy %s\n", why);
        if (r > 0) st = fn(src, ents[i]->d_name, ctx);
        free(ents[i]);
    }
    free(ents);
    return st;
}

static lpx_status check_one(const char *src, const char *name, void *ctx)
{
    int copy;
    return dest_state(src, ctx, name, &copy);
}

static lpx_status nothing(const char *src, const char *name, void *ctx)
{
    (void)src, (void)name, (void)ctx;
    return LPX_OK;
}

lpx_status tr_hf_check_copy(const char *init, const char *out, FILE *warn)
{
    struct stat sb;
    return each_copied(init, warn, stat(out, &sb) == 0 ? check_one : nothing, (void *)out);
}

static lpx_status copy_one(const char *src, const char *name, void *ctx)
{
    const char *out = ctx;
    int copy;
    lpx_status st = dest_state(src, out, name, &copy);
    if (st || !copy) return st;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", out, name);
    /* O_NONBLOCK: a FIFO swapped in since the check is not waited on */
    int fd = open(src, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = lpx_error(LPX_EIO, "--save-hf: cannot read '%s': %s", src, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return st;
    }
    tr_outfile o;
    if ((st = tr_outfile_open("--save-hf", path, &o))) {
        close(fd);
        return st;
    }
    static char buf[1 << 16];
    ssize_t k;
    while ((k = read(fd, buf, sizeof buf)) > 0)
        if (fwrite(buf, 1, (size_t)k, o.f) != (size_t)k) break;
    int e = errno;
    bool bad = k != 0;
    close(fd);
    if (bad) {
        tr_outfile_abort(&o);
        return lpx_error(LPX_EIO, "--save-hf: cannot copy '%s' to '%s': %s", src, path, strerror(e));
    }
    return tr_outfile_commit(&o);
}

/* DIR's config.json object with lpx's fields set: the weights are f32;
 * nothing of it is quantized */
static lpx_status config_from(const char *init, cJSON **out)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", init);
    lpx_status st = tr_json_read(path, out);
    if (st) return st;
    cJSON *c = *out;
    bool any = false;
    static const char *const keys[] = {"torch_dtype", "dtype"};
    for (int i = 0; i < 2; i++)
        if (cJSON_HasObjectItem(c, keys[i])) {
            cJSON_ReplaceItemInObjectCaseSensitive(c, keys[i], cJSON_CreateString("float32"));
            any = true;
        }
    if (!any) cJSON_AddStringToObject(c, "torch_dtype", "float32");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "quantization_config");
    return LPX_OK;
}

lpx_status tr_hf_write_config(const char *dir, const tr_geom *g, const char *init)
{
    lpx_status st = LPX_OK;
    char *text = NULL, path[1200];
    cJSON *cfg = NULL;
    if (init) {
        /* the files first: config.json, last, says the folder is whole */
        TRY(each_copied(init, NULL, copy_one, (void *)dir));
        TRY(config_from(init, &cfg));
    } else {
        cfg = config_of(g);
    }
    text = cfg ? cJSON_Print(cfg) : NULL;
    if (!text) FAIL(LPX_ENOMEM, "--save-hf: out of memory");
    snprintf(path, sizeof path, "%s/config.json", dir);
    /* a fresh temporary beside it, renamed (a link's target replaced, a
     * FIFO refused: outfile.c) */
    tr_outfile o;
    TRY(tr_outfile_open("--save-hf", path, &o));
    if (fputs(text, o.f) < 0 || fputc('\n', o.f) == EOF) {
        tr_outfile_abort(&o);
        FAIL(LPX_EIO, "--save-hf: cannot write '%s': %s", path, strerror(errno));
    }
    TRY(tr_outfile_commit(&o));
    TRY(remove_stale(dir));
out:
    cJSON_free(text);
    cJSON_Delete(cfg);
    return st;
}

lpx_status tr_hf_save(const char *dir, const tr_geom *g, float *const *w)
{
    lpx_status st = LPX_OK;
    char path[1200];
    lpx_tensor **ts = calloc((size_t)g->nparams, sizeof *ts);
    char (*names)[96] = calloc((size_t)g->nparams, sizeof *names);
    const char **np = calloc((size_t)g->nparams, sizeof *np);
    if (!ts || !names || !np) FAIL(LPX_ENOMEM, "out of memory");
    if (!make_dirs(dir)) FAIL(LPX_EIO, "cannot create '%s': %s", dir, strerror(errno));
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        bool is1d = P->kind == TR_P_NORM || P->kind == TR_P_NORMF;
        int64_t shape[2] = {P->rows, P->cols};
        tr_hf_name(P, names[p], sizeof names[p]);
        np[p] = names[p];
        TRY(lpx_tensor_from_blob(w[p], LPX_F32, is1d ? 1 : 2, shape, NULL, lpx_cpu(), NULL, NULL, &ts[p]));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    lpx_safetensors_kv meta = {"format", "pt"};
    TRY(lpx_safetensors_save(path, g->nparams, np, ts, 1, &meta));
    TRY(tr_hf_write_config(dir, g, NULL));
out:
    for (int p = 0; ts && p < g->nparams; p++) lpx_tensor_release(ts[p]);
    free(ts);
    free(names);
    free(np);
    return st;
}
