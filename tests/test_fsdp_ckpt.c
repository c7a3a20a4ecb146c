/* Sharded checkpoints (include/lpx/checkpoint.h): save at world size W,
 * load at W' for every pair of {1, 2, 3, 4, 8}, the state gathered after
 * the load equals the saved state bit for bit: dense f32 and bf16
 * parameters with uneven rows, a float8_weight's f32 master, AdamW's
 * moments and step; an NF4 base (no dense master) at the same world size;
 * a second save replaces the first atomically; damaged checkpoints
 * (a missing rank file, a truncated one, an index from another model, a
 * directory that is not a checkpoint) refused on every rank with one line
 * naming the file or parameter. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "tensor_util.h"
#include "dt_util.h"

#define NP 4
static const int64_t shapes[NP][2] = {{37, 8}, {13, 5}, {21, 16}, {3, 7}};
static const lpx_dtype dtypes[NP] = {LPX_F32, LPX_BF16, LPX_F32, LPX_F32};

typedef struct ck_ctx {
    const char *dir;
    bool save, zeros, with_nf4, expect_fail;
    bool dense2;                 /* param 2 dense f32 instead of a float8_weight */
    const char *export_path;     /* export instead of save/load (dtype export_dtype) */
    const char *import_path;     /* import from this consolidated file instead of a load */
    lpx_dtype export_dtype;
    bool export_rename;          /* names "p<i>", param 3 left out */
    const char *user;            /* save: rank 0's user object */
    bool extras;                 /* save: each rank's extra "rank<r>" (u8, r + 1 bytes of r) */
    bool dup_extra;              /* save: every rank names its extra "same" */
    unsigned load_flags;
    /* hybrid: a 2-D mesh of 2 replicas x (world / 2) shards; replica 1's
     * image goes to *rep1 */
    bool hybrid;
    lpx_comm *outer[MAXR], *inner[MAXR];
    struct ck_ctx *rep1;
    lpx_tensor *full[NP], *nf4;
    /* the global image of every parameter (f32 values) and moment, written
     * row by row by the ranks that own them */
    float *img[NP], *m[NP], *v[NP];
    int64_t step[NP];
    uint8_t *nf4_codes;
    lpx_status st[MAXR];
    char msg[MAXR][512];
} ck_ctx;

static int64_t numel2(const int64_t *s) { return s[0] * s[1]; }

/* the f32 values of a dense tensor into dst */
static void to_f32(lpx_tensor *t, float *dst)
{
    lpx_tensor *c = NULL, *f = NULL;
    if (!lpx_cast(t, LPX_F32, false, &c) && !lpx_contiguous(c, &f))
        memcpy(dst, lpx_tensor_data(f), (size_t)lpx_tensor_numel(f) * sizeof(float));
    lpx_tensor_release(c);
    lpx_tensor_release(f);
}

static lpx_status build(lpx_comm *comm, ck_ctx *c, lpx_fsdp **fp, lpx_fsdp_group *g[2])
{
    int r = lpx_comm_rank(comm);
    lpx_status st;
    if (c->hybrid) {
        lpx_mesh *mesh = NULL;
        st = lpx_mesh_new_2d(c->outer[r], c->inner[r], &mesh);
        if (!st) st = lpx_fsdp_new(mesh, NULL, fp);
        lpx_mesh_release(mesh);
    } else {
        st = new_engine(comm, NULL, fp);
    }
    if (st) return st;
    RCHECK_OK(r, lpx_fsdp_group_add(*fp, "emb", &g[0]));
    RCHECK_OK(r, lpx_fsdp_group_add(*fp, "block0", &g[1]));
    for (int i = 0; i < NP; i++) {
        lpx_tensor *full = c->full[i], *z = NULL, *w = NULL;
        if (c->zeros) {   /* a fresh model: the load must fill every value */
            RCHECK_OK(r, lpx_zeros(2, shapes[i], dtypes[i], lpx_cpu(), &z));
            full = z;
        }
        if (i == 2 && !c->dense2) {
            lpx_float8_weight_opts wo = {.struct_size = sizeof wo};
            RCHECK_OK(r, lpx_float8_weight_new(full, &wo, &w));
            full = w;
        }
        RCHECK_OK(r, lpx_fsdp_param_add(g[i == 0 ? 0 : 1], i == 3 ? "norm" : "w", full, 0, NULL));
        lpx_tensor_release(z);
        lpx_tensor_release(w);
    }
    if (c->with_nf4) RCHECK_OK(r, lpx_fsdp_param_add(g[1], "base", c->nf4, LPX_FSDP_FROZEN, NULL));
    return lpx_fsdp_shard(*fp);
}

/* every rank's rows of params, masters and moments into the images */
static void image(lpx_fsdp_group *g[2], ck_ctx *c, int r, bool step_writer)
{
    for (int i = 0; i < NP; i++) {
        lpx_fsdp_group *G = g[i == 0 ? 0 : 1];
        int k = i == 0 ? 0 : i - 1;
        int64_t start = 0, len = 0, cols = shapes[i][1];
        RCHECK_OK(r, lpx_fsdp_param_rows(G, k, &start, &len, NULL));
        lpx_tensor *loc = lpx_fsdp_param_local(G, k);
        if (lpx_tensor_kind(loc)) loc = lpx_float8_weight_master(loc);
        if (len) to_f32(loc, c->img[i] + start * cols);
        lpx_tensor *m = NULL, *v = NULL;
        int64_t step = 0;
        RCHECK_OK(r, lpx_fsdp_param_adamw_state(G, k, &m, &v, &step));
        if (m && len) {
            memcpy(c->m[i] + start * cols, lpx_tensor_data(m), (size_t)(len * cols) * sizeof(float));
            memcpy(c->v[i] + start * cols, lpx_tensor_data(v), (size_t)(len * cols) * sizeof(float));
        }
        if (step_writer) c->step[i] = step;   /* the same on every rank: one writer */
        lpx_tensor_release(m);
        lpx_tensor_release(v);
    }
    if (c->with_nf4) {
        lpx_tensor *loc = lpx_fsdp_param_local(g[1], NP - 1), *codes = lpx_tensor_inner(loc, 0);
        int64_t start = 0, len = 0;
        RCHECK_OK(r, lpx_fsdp_param_rows(g[1], NP - 1, &start, &len, NULL));
        RCHECK(r, lpx_tensor_numel(codes) >= len * 64 / 2);
        if (len && lpx_tensor_numel(codes) >= len * 64 / 2)
            memcpy(c->nf4_codes + start * 64 / 2, lpx_tensor_data(codes), (size_t)(len * 64 / 2));
    }
}

/* export names: "p0".."p2" for the first three parameters, the norm left out */
static bool export_name(void *ctx, lpx_fsdp_group *g, int i, char *buf, size_t len)
{
    (void)ctx;
    int p = !strcmp(lpx_fsdp_group_name(g), "emb") ? 0 : i + 1;
    if (p == 3 || p >= NP) return false;
    snprintf(buf, len, "p%d", p);
    return true;
}

static lpx_status ck_rank(lpx_comm *comm, void *vctx)
{
    ck_ctx *c = vctx;
    int r = lpx_comm_rank(comm);
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g[2] = {NULL, NULL};
    lpx_status st = build(comm, c, &f, g);
    if (st) {
        lpx_fsdp_free(f);
        return st;
    }
    if (c->save) {
        /* AdamW state that depends on the global element: moments and a step */
        for (int i = 0; i < NP; i++) {
            lpx_fsdp_group *G = g[i == 0 ? 0 : 1];
            int k = i == 0 ? 0 : i - 1;
            int64_t start = 0, len = 0, cols = shapes[i][1], n = 0;
            RCHECK_OK(r, lpx_fsdp_param_rows(G, k, &start, &len, NULL));
            n = len * cols;
            lpx_tensor *m = NULL, *v = NULL;
            RCHECK_OK(r, lpx_zeros(1, &n, LPX_F32, lpx_cpu(), &m));
            RCHECK_OK(r, lpx_zeros(1, &n, LPX_F32, lpx_cpu(), &v));
            for (int64_t e = 0; m && v && e < n; e++) {
                ((float *)lpx_tensor_data(m))[e] = 0.001f * (float)(start * cols + e) + (float)i;
                ((float *)lpx_tensor_data(v))[e] = 1.0f / (float)(1 + start * cols + e);
            }
            RCHECK_OK(r, lpx_fsdp_param_set_adamw_state(G, k, m, v, 7 + i));
            lpx_tensor_release(m);
            lpx_tensor_release(v);
        }
        lpx_tensor *ex = NULL;
        char exname[32];
        const char *names[1] = {exname};
        if (c->extras) {
            int64_t n = r + 1;
            RCHECK_OK(r, lpx_zeros(1, &n, LPX_U8, lpx_cpu(), &ex));
            if (ex) memset(lpx_tensor_data(ex), r, (size_t)n);
            snprintf(exname, sizeof exname, c->dup_extra ? "same" : "rank%d", r);
        }
        lpx_fsdp_ckpt_opts o = {.struct_size = sizeof o, .user_json = c->user, .nextra = ex ? 1 : 0,
                                .extra_names = names, .extra = &ex};
        st = lpx_fsdp_save_ex(f, c->dir, &o);
        lpx_tensor_release(ex);
    } else if (c->import_path) {
        lpx_safetensors *sf = NULL;
        st = lpx_safetensors_open(c->import_path, &sf);
        if (!st) st = lpx_fsdp_import(f, 1, &sf, c->export_rename ? export_name : NULL, NULL);
        lpx_safetensors_close(sf);
    } else if (c->export_path) {
        st = lpx_fsdp_export(f, c->export_path, c->export_dtype, c->export_rename ? export_name : NULL, NULL, 0, NULL);
    } else {
        lpx_fsdp_ckpt_opts o = {.struct_size = sizeof o, .flags = c->load_flags};
        st = lpx_fsdp_load_ex(f, c->dir, &o);
    }
    c->st[r] = st;
    snprintf(c->msg[r], sizeof c->msg[r], "%s", st ? lpx_last_error() : "");
    if (!st && !c->export_path) {
        int shard_rank = c->hybrid ? lpx_comm_rank(c->inner[r]) : r;
        bool rep1 = c->hybrid && lpx_comm_rank(c->outer[r]) == 1;
        if (!rep1 || c->rep1) image(g, rep1 ? c->rep1 : c, r, shard_rank == 0);
    }
    if (!st && c->with_nf4 && !c->save && !c->export_path && !c->import_path) {
        /* the loaded NF4 base gathers: every rank's shard, an empty one
         * included, carries the saved tensor's scaler mean (an empty shard
         * once kept the mean of the model it was built from) */
        RCHECK_OK(r, lpx_fsdp_unshard(g[1]));
        RCHECK_OK(r, lpx_fsdp_reshard(g[1]));
    }
    lpx_fsdp_free(f);
    return c->expect_fail ? LPX_OK : st;
}

static void ctx_init_seed(ck_ctx *c, const char *dir, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->dir = dir;
    for (int i = 0; i < NP; i++) {
        c->full[i] = rand_normal(2, shapes[i], seed + (uint64_t)i, 1.0, dtypes[i]);
        c->img[i] = calloc((size_t)numel2(shapes[i]), sizeof(float));
        c->m[i] = calloc((size_t)numel2(shapes[i]), sizeof(float));
        c->v[i] = calloc((size_t)numel2(shapes[i]), sizeof(float));
    }
}

static void ctx_init(ck_ctx *c, const char *dir) { ctx_init_seed(c, dir, 900); }

static void ctx_free(ck_ctx *c)
{
    for (int i = 0; i < NP; i++) {
        lpx_tensor_release(c->full[i]);
        free(c->img[i]);
        free(c->m[i]);
        free(c->v[i]);
    }
    lpx_tensor_release(c->nf4);
    free(c->nf4_codes);
}

static bool same_images(ck_ctx *a, ck_ctx *b, char *why, size_t len)
{
    for (int i = 0; i < NP; i++) {
        size_t n = (size_t)numel2(shapes[i]) * sizeof(float);
        if (memcmp(a->img[i], b->img[i], n)) return snprintf(why, len, "param %d values", i), false;
        if (memcmp(a->m[i], b->m[i], n) || memcmp(a->v[i], b->v[i], n))
            return snprintf(why, len, "param %d AdamW moments", i), false;
        if (a->step[i] != b->step[i]) return snprintf(why, len, "param %d step", i), false;
    }
    return true;
}

static char root[256];

static void test_reshard_every_world_pair(void)
{
    char dir[300];
    int pairs = 0;
    for (int a = 0; a < NWORLDS; a++) {
        snprintf(dir, sizeof dir, "%s/w%d", root, worlds[a]);
        ck_ctx saved;
        ctx_init(&saved, dir);
        saved.save = true;
        run_ranks(worlds[a], ck_rank, &saved);
        for (int b = 0; b < NWORLDS; b++) {
            ck_ctx loaded;
            ctx_init(&loaded, dir);
            loaded.zeros = true;
            run_ranks(worlds[b], ck_rank, &loaded);
            char why[128] = "";
            CHECKF(same_images(&saved, &loaded, why, sizeof why), "saved on %d, loaded on %d: %s differ", worlds[a],
                   worlds[b], why);
            ctx_free(&loaded);
            pairs++;
        }
        ctx_free(&saved);
    }
    CHECK(pairs == NWORLDS * NWORLDS);
}

/* An NF4 base (no dense master, 1024 x 64: scaler blocks of 256 rows, the
 * shard unit): saved on 4 ranks and loaded on 1, 2, 3, 4, 8, and saved on
 * 1 and loaded on 4, its shards re-cut through the kind's all-gather
 * hooks: the codes equal the saved ones bit for bit, overwriting another
 * model's. */
#define NF4_ROWS 1024
static void nf4_case(int save_world, int load_world, const char *dir)
{
    int64_t s[2] = {NF4_ROWS, 64};
    size_t nbytes = NF4_ROWS * 64 / 2;
    ck_ctx a, b;
    ctx_init(&a, dir);
    ctx_init(&b, dir);
    lpx_tensor *x = rand_normal(2, s, 77, 1.0, LPX_F32), *z = rand_normal(2, s, 78, 1.0, LPX_F32);
    CHECK_OK(lpx_nf4_quantize(x, NULL, &a.nf4));
    CHECK_OK(lpx_nf4_quantize(z, NULL, &b.nf4));   /* another model of the same layout: the load overwrites it */
    a.with_nf4 = b.with_nf4 = true;
    a.nf4_codes = calloc(nbytes, 1);
    b.nf4_codes = calloc(nbytes, 1);
    a.save = true;
    run_ranks(save_world, ck_rank, &a);
    b.zeros = true;
    run_ranks(load_world, ck_rank, &b);
    char why[128] = "";
    CHECKF(same_images(&a, &b, why, sizeof why), "nf4 case %d -> %d: %s", save_world, load_world, why);
    CHECKF(!memcmp(a.nf4_codes, b.nf4_codes, nbytes), "nf4 codes differ after %d -> %d", save_world, load_world);
    lpx_tensor_release(x);
    lpx_tensor_release(z);
    ctx_free(&a);
    ctx_free(&b);
}

static void test_nf4_recut_across_worlds(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/nf4", root);
    for (int w = 0; w < NWORLDS; w++) nf4_case(4, worlds[w], dir);
    nf4_case(1, 4, dir);
    nf4_case(3, 8, dir);
}

static bool any_says(ck_ctx *c, int n, const char *needle)
{
    for (int r = 0; r < n; r++)
        if (strstr(c->msg[r], needle)) return true;
    return false;
}

static void refused(const char *dir, int world, const char *needle)
{
    ck_ctx c;
    ctx_init(&c, dir);
    c.zeros = true;
    c.expect_fail = true;
    run_ranks(world, ck_rank, &c);
    for (int r = 0; r < world; r++) CHECKF(c.st[r] != LPX_OK, "rank %d accepted a damaged checkpoint", r);
    CHECKF(any_says(&c, world, needle), "no rank says '%s' (rank 0: '%s')", needle, c.msg[0]);
    ctx_free(&c);
}

/* Recomputes index.json's self-checksum after an edit (FNV-1a 64 of the
 * text with the checksum's 16 digits as zeros), so that what the edit
 * changed is what a load sees. */
static bool resum_index(const char *path)
{
    static char text[1 << 20];
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *d = strstr(text, "\"checksum\":");
    d = d ? strchr(d + 11, '"') : NULL;
    if (!d) return false;
    memset(d + 1, '0', 16);
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)text[i]) * 0x100000001B3ull;
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h);
    memcpy(d + 1, hx, 16);
    f = fopen(path, "wb");
    bool ok = f && fwrite(text, 1, n, f) == n;
    if (f) ok = fclose(f) == 0 && ok;
    return ok;
}

static void test_damage_refused(void)
{
    char dir[300], path[400], cmd[2048];
    snprintf(dir, sizeof dir, "%s/dmg", root);
    ck_ctx a;
    ctx_init(&a, dir);
    a.save = true;
    run_ranks(2, ck_rank, &a);
    ctx_free(&a);
    /* a second save replaces the first; no .tmp or .old is left behind */
    ctx_init(&a, dir);
    a.save = true;
    run_ranks(3, ck_rank, &a);
    ctx_free(&a);
    struct stat sb;
    snprintf(path, sizeof path, "%s.tmp", dir);
    CHECK(stat(path, &sb) != 0);
    snprintf(path, sizeof path, "%s.old", dir);
    CHECK(stat(path, &sb) != 0);
    snprintf(path, sizeof path, "%s/rank-00002-of-00003.safetensors", dir);
    CHECK(stat(path, &sb) == 0);
    /* truncated rank file */
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak' && truncate -s -8 '%s'", path, path, path);
    CHECK(system(cmd) == 0);
    refused(dir, 2, "truncated");
    /* missing rank file */
    CHECK(unlink(path) == 0);
    refused(dir, 4, "missing");
    snprintf(cmd, sizeof cmd, "mv '%s.bak' '%s'", path, path);
    CHECK(system(cmd) == 0);
    /* a model with another shape: param 0 saved as [37, 8], asked as [37, 9] */
    snprintf(path, sizeof path, "%s/index.json", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak' && sed -i 's#\"emb/0/w\"#\"emb/0/x\"#' '%s'", path, path, path);
    CHECK(system(cmd) == 0);
    refused(dir, 2, "the index was edited or damaged");   /* its own checksum */
    CHECK(resum_index(path));
    refused(dir, 1, "emb/0/w");
    snprintf(cmd, sizeof cmd, "mv '%s.bak' '%s'", path, path);
    CHECK(system(cmd) == 0);
    /* not an index */
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak' && echo '{\"format\": 1}' > '%s'", path, path, path);
    CHECK(system(cmd) == 0);
    refused(dir, 2, "not an lpx checkpoint index");
    snprintf(cmd, sizeof cmd, "mv '%s.bak' '%s'", path, path);
    CHECK(system(cmd) == 0);
    /* intact again: loads */
    ck_ctx ok;
    ctx_init(&ok, dir);
    ok.zeros = true;
    run_ranks(2, ck_rank, &ok);
    ctx_free(&ok);
    /* saving onto a directory that is not a checkpoint is refused everywhere */
    snprintf(dir, sizeof dir, "%s/notckpt", root);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/keep.txt", dir);
    FILE *fp = fopen(path, "w");
    if (fp) fclose(fp);
    ck_ctx s;
    ctx_init(&s, dir);
    s.save = true;
    s.expect_fail = true;
    run_ranks(2, ck_rank, &s);
    CHECK(s.st[0] == LPX_EINVAL && s.st[1] == LPX_EINVAL);
    CHECK(strstr(s.msg[0], "not an lpx checkpoint") && strstr(s.msg[1], "rank 0 failed"));
    CHECK(stat(path, &sb) == 0);   /* nothing of the user's was touched */
    ctx_free(&s);
    CHECK_ERR(lpx_fsdp_save(NULL, dir), LPX_EINVAL);
    CHECK_ERR(lpx_fsdp_load(NULL, dir), LPX_EINVAL);
}

/* SIGKILL at random moments of repeated saves (the whole job: the local
 * backend's ranks are threads of one process): every time, the directory
 * loads, and holds either the previous checkpoint or the new one, whole. */
static void test_sigkill_during_saves(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/kill", root);
    ck_ctx a, b;
    ctx_init_seed(&a, dir, 900);
    ctx_init_seed(&b, dir, 5000);
    a.save = b.save = true;
    char scratch[320];
    snprintf(scratch, sizeof scratch, "%s/kill-b", root);
    b.dir = scratch;
    run_ranks(2, ck_rank, &b);      /* generation B's image (saved elsewhere) */
    b.dir = dir;
    run_ranks(2, ck_rank, &a);      /* generation A: the image to keep */
    int got_a = 0, got_b = 0, kills = 0;
    unsigned seed = 12345;
    for (int k = 0; k < 50; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) {   /* generation B, saved until killed */
                memset(results, 0, sizeof results);
                if (lpx_local_run(2, ck_rank, &b, 20000, NULL)) _exit(3);
            }
        }
        CHECK(pid > 0);
        if (pid <= 0) break;
        seed = seed * 1103515245u + 12345u;
        struct timespec ts = {0, (long)((seed >> 8) % 20000) * 1000L};   /* 0-20 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int wst = 0;
        waitpid(pid, &wst, 0);
        kills += WIFSIGNALED(wst);
        ck_ctx l;
        ctx_init(&l, dir);
        l.zeros = true;
        run_ranks(2, ck_rank, &l);
        char why[128];
        bool is_a = same_images(&a, &l, why, sizeof why), is_b = same_images(&b, &l, why, sizeof why);
        CHECKF(is_a || is_b, "kill %d: the checkpoint is neither the previous one nor the new one (%s; load %s)", k,
               why, l.msg[0]);
        got_a += is_a;
        got_b += is_b;
        ctx_free(&l);
        if (is_b) {   /* start again from A, so that both outcomes stay possible */
            memset(results, 0, sizeof results);
            run_ranks(2, ck_rank, &a);
        }
    }
    printf("     50 kills (%d by SIGKILL): previous checkpoint %d times, new one %d times\n", kills, got_a, got_b);
    CHECK(kills == 50);
    ctx_free(&a);
    ctx_free(&b);
}

/* A framework's own state rides with the model: rank 0's user object and
 * each rank's extra tensors, committed with the shards and read back by
 * any process through lpx_fsdp_ckpt_open, whatever the world size. */
static void test_user_and_extras(void)
{
    char dir[300], path[400], cmd[2048];
    snprintf(dir, sizeof dir, "%s/user", root);
    ck_ctx a;
    ctx_init(&a, dir);
    a.save = true;
    a.user = "{\"step\": 12, \"data\": {\"position\": 12}, \"loss\": [3.5, 3.25]}";
    a.extras = true;
    run_ranks(3, ck_rank, &a);
    ctx_free(&a);
    lpx_fsdp_ckpt *c = NULL;
    CHECK_OK(lpx_fsdp_ckpt_open(dir, &c));
    CHECK(lpx_fsdp_ckpt_world(c) == 3);
    /* what it records of each parameter, for a check before building */
    CHECK(lpx_fsdp_ckpt_param_count(c) == NP);
    for (int i = 0; i < NP && lpx_fsdp_ckpt_param_count(c) == NP; i++) {
        lpx_fsdp_ckpt_param_info pi;
        CHECK_OK(lpx_fsdp_ckpt_param(c, i, &pi));
        CHECKF(pi.ndim == 2 && pi.shape[0] == shapes[i][0] && pi.shape[1] == shapes[i][1] && pi.dtype == dtypes[i] &&
               !strcmp(pi.name, i == 3 ? "norm" : "w") && !strcmp(pi.kind, i == 2 ? "float8_weight" : "") && !pi.frozen,
               "param %d: %s %s %s", i, pi.key, pi.name, pi.kind);
    }
    lpx_fsdp_ckpt_param_info pbad;
    CHECK_ERR(lpx_fsdp_ckpt_param(c, NP, &pbad), LPX_EINVAL);
    const char *u = lpx_fsdp_ckpt_user(c);
    CHECKF(u && !strcmp(u, "{\"step\":12,\"data\":{\"position\":12},\"loss\":[3.5,3.25]}"), "user: %s", u ? u : "(null)");
    for (int r = 0; r < 3; r++) {
        char name[16];
        snprintf(name, sizeof name, "rank%d", r);
        lpx_tensor *t = NULL;
        CHECK_OK(lpx_fsdp_ckpt_extra(c, name, 0, &t));
        bool ok = t && lpx_tensor_dtype(t) == LPX_U8 && lpx_tensor_numel(t) == r + 1;
        for (int k = 0; ok && k <= r; k++) ok = ((const uint8_t *)lpx_tensor_data(t))[k] == r;
        CHECKF(ok, "extra %s does not hold what rank %d saved", name, r);
        lpx_tensor_release(t);
    }
    lpx_tensor *t = NULL;
    CHECK_ERR(lpx_fsdp_ckpt_extra(c, "rank3", 0, &t), LPX_ENOTFOUND);
    CHECK(strstr(lpx_last_error(), "rank3") != NULL);
    CHECK_ERR(lpx_fsdp_ckpt_extra(c, NULL, 0, &t), LPX_EINVAL);
    lpx_fsdp_ckpt_close(c);
    /* the model loads on another world size with the extras beside it */
    ck_ctx l;
    ctx_init(&l, dir);
    l.zeros = true;
    run_ranks(2, ck_rank, &l);
    for (int r = 0; r < 2; r++) CHECKF(l.st[r] == LPX_OK, "rank %d: %s", r, l.msg[r]);
    ctx_free(&l);

    /* one byte of rank 1's data changed, the size kept: the checksum
     * refuses it (load and reader); NO_VERIFY checks sizes only */
    snprintf(path, sizeof path, "%s/rank-00001-of-00003.safetensors", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak' && printf U | dd of='%s' bs=1 seek=$(( $(stat -c %%s '%s') - 1 )) "
             "conv=notrunc status=none", path, path, path, path);
    CHECK(system(cmd) == 0);
    refused(dir, 3, "checksum");
    ck_ctx nv;
    ctx_init(&nv, dir);
    nv.zeros = true;
    nv.load_flags = LPX_FSDP_CKPT_NO_VERIFY;
    run_ranks(3, ck_rank, &nv);
    for (int r = 0; r < 3; r++) CHECKF(nv.st[r] == LPX_OK, "NO_VERIFY rank %d: %s", r, nv.msg[r]);
    ctx_free(&nv);
    CHECK_OK(lpx_fsdp_ckpt_open(dir, &c));
    CHECK_ERR(lpx_fsdp_ckpt_extra(c, "rank1", 0, &t), LPX_EIO);
    CHECK(strstr(lpx_last_error(), "checksum") && strstr(lpx_last_error(), "rank-00001-of-00003"));
    CHECK_OK(lpx_fsdp_ckpt_extra(c, "rank0", 0, &t));   /* another rank's file is intact */
    lpx_tensor_release(t);
    t = NULL;
    lpx_fsdp_ckpt_close(c);
    snprintf(cmd, sizeof cmd, "mv '%s.bak' '%s'", path, path);
    CHECK(system(cmd) == 0);

    /* refusals at save: a name two ranks use, a user text that is not an
     * object; the previous checkpoint stays */
    ck_ctx d;
    ctx_init(&d, dir);
    d.save = d.extras = d.dup_extra = d.expect_fail = true;
    run_ranks(2, ck_rank, &d);
    CHECKF(d.st[0] == LPX_EINVAL && strstr(d.msg[0], "'same' is given by ranks 0 and 1"), "dup extra: %s", d.msg[0]);
    CHECKF(d.st[1] == LPX_EINVAL, "dup extra, rank 1: %s", d.msg[1]);
    ctx_free(&d);
    ctx_init(&d, dir);
    d.save = d.expect_fail = true;
    d.user = "[1, 2]";
    run_ranks(2, ck_rank, &d);
    CHECKF(d.st[0] == LPX_EINVAL && strstr(d.msg[0], "not the text of a JSON object"), "user: %s", d.msg[0]);
    ctx_free(&d);
    CHECK_OK(lpx_fsdp_ckpt_open(dir, &c));
    CHECK(lpx_fsdp_ckpt_world(c) == 3);
    lpx_fsdp_ckpt_close(c);
    snprintf(path, sizeof path, "%s/none", root);
    CHECK_ERR(lpx_fsdp_ckpt_open(path, &c), LPX_EIO);
    CHECK(c == NULL);
    lpx_fsdp_ckpt_close(NULL);
}

/* A dense parameter and a float8_weight's master load into each other
 * (a bf16 run resumed as float8 and back), across world sizes. */
static void test_dense_master_interchange(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/interchange", root);
    for (int way = 0; way < 2; way++) {
        ck_ctx a, b;
        ctx_init(&a, dir);
        ctx_init(&b, dir);
        a.save = true;
        a.dense2 = way == 0;
        b.zeros = true;
        b.dense2 = way == 1;
        run_ranks(3, ck_rank, &a);
        run_ranks(2, ck_rank, &b);
        char why[128] = "";
        CHECKF(same_images(&a, &b, why, sizeof why), "%s saved, %s loaded: %s differ", way ? "float8_weight" : "dense",
               way ? "dense" : "float8_weight", why);
        ctx_free(&a);
        ctx_free(&b);
    }
}

/* Hybrid sharding (a 2-D mesh: 2 replicas x N shards): replica 0 writes,
 * and a checkpoint moves between 1-D and 2-D meshes: saved on 2 x 2,
 * loaded on 3 ranks and on 2 x 3 (both replicas); saved on 3 ranks,
 * loaded on 2 x 2; the same state bit for bit everywhere. */
static void hybrid_comms(ck_ctx *c, int world)
{
    int cols = world / 2;
    lpx_comm *tmp[MAXR];
    for (int j = 0; j < cols; j++) {
        CHECK_OK(lpx_local_comm_group_create(2, tmp));
        for (int i = 0; i < 2; i++) c->outer[i * cols + j] = tmp[i];
    }
    for (int i = 0; i < 2; i++) {
        CHECK_OK(lpx_local_comm_group_create(cols, tmp));
        for (int j = 0; j < cols; j++) c->inner[i * cols + j] = tmp[j];
    }
    c->hybrid = true;
}

static void hybrid_free(ck_ctx *c, int world)
{
    for (int r = 0; r < world; r++) {
        lpx_comm_destroy(c->outer[r]);
        lpx_comm_destroy(c->inner[r]);
    }
}

static void test_hybrid_mesh(void)
{
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/hybrid", root);
    ck_ctx a;
    ctx_init(&a, dir);
    a.save = true;
    hybrid_comms(&a, 4);
    run_ranks(4, ck_rank, &a);
    hybrid_free(&a, 4);
    struct stat sb;
    snprintf(path, sizeof path, "%s/rank-00001-of-00002.safetensors", dir);
    CHECKF(stat(path, &sb) == 0, "a 2 x 2 save writes 2 rank files (replica 0's)");
    snprintf(path, sizeof path, "%s/rank-00000-of-00004.safetensors", dir);
    CHECK(stat(path, &sb) != 0);
    /* 2 x 2 -> 3 ranks, and -> 2 x 3 with both replicas checked */
    ck_ctx b, c, c1;
    ctx_init(&b, dir);
    b.zeros = true;
    run_ranks(3, ck_rank, &b);
    char why[128] = "";
    CHECKF(same_images(&a, &b, why, sizeof why), "2 x 2 saved, 3 loaded: %s differ", why);
    ctx_init(&c, dir);
    ctx_init(&c1, dir);
    c.zeros = true;
    c.rep1 = &c1;
    hybrid_comms(&c, 6);
    run_ranks(6, ck_rank, &c);
    hybrid_free(&c, 6);
    CHECKF(same_images(&a, &c, why, sizeof why), "2 x 2 saved, 2 x 3 loaded (replica 0): %s differ", why);
    CHECKF(same_images(&a, &c1, why, sizeof why), "2 x 2 saved, 2 x 3 loaded (replica 1): %s differ", why);
    ctx_free(&b);
    ctx_free(&c);
    ctx_free(&c1);
    /* 3 ranks -> 2 x 2 */
    ck_ctx d, e, e1;
    ctx_init_seed(&d, dir, 4242);
    d.save = true;
    run_ranks(3, ck_rank, &d);
    ctx_init_seed(&e, dir, 4242);
    ctx_init_seed(&e1, dir, 4242);
    e.zeros = true;
    e.rep1 = &e1;
    hybrid_comms(&e, 4);
    run_ranks(4, ck_rank, &e);
    hybrid_free(&e, 4);
    CHECKF(same_images(&d, &e, why, sizeof why), "3 saved, 2 x 2 loaded (replica 0): %s differ", why);
    CHECKF(same_images(&d, &e1, why, sizeof why), "3 saved, 2 x 2 loaded (replica 1): %s differ", why);
    /* an extra tensor from replica 1 is refused (only replica 0 writes) */
    ck_ctx x;
    ctx_init(&x, dir);
    x.save = x.extras = x.expect_fail = true;
    hybrid_comms(&x, 4);
    run_ranks(4, ck_rank, &x);
    hybrid_free(&x, 4);
    CHECKF(x.st[2] == LPX_EINVAL && strstr(x.msg[2], "only replica 0's ranks save them"), "replica 1 extra: %s",
           x.msg[2]);
    for (int r = 0; r < 4; r++) CHECKF(x.st[r] != LPX_OK, "rank %d accepted", r);
    ctx_free(&a);
    ctx_free(&d);
    ctx_free(&e);
    ctx_free(&e1);
    ctx_free(&x);
}

/* The consolidated export: every rank writes its rows of one safetensors
 * file; the file holds each parameter at its global shape, bit for bit
 * (f32; bf16 rounded as lpx_cast rounds), for world sizes 1-8, renamed
 * and filtered by the caller's name function; an NF4 base dequantized. */
static void check_export(int world, lpx_dtype dtype, bool rename_, bool nf4)
{
    char path[300];
    snprintf(path, sizeof path, "%s/export-%d.safetensors", root, world);
    ck_ctx c;
    ctx_init(&c, NULL);
    c.export_path = path;
    c.export_dtype = dtype;
    c.export_rename = rename_;
    int64_t s[2] = {NF4_ROWS, 64};
    lpx_tensor *x = NULL, *deq = NULL;
    if (nf4) {
        x = rand_normal(2, s, 77, 1.0, LPX_F32);
        CHECK_OK(lpx_nf4_quantize(x, NULL, &c.nf4));
        CHECK_OK(lpx_kind_to_dense(c.nf4, &deq));
        c.with_nf4 = true;
    }
    run_ranks(world, ck_rank, &c);
    lpx_safetensors *f = NULL;
    CHECK_OK(lpx_safetensors_open(path, &f));
    int want = rename_ ? NP - 1 : NP + (nf4 ? 1 : 0);
    CHECKF(f && lpx_safetensors_count(f) == want, "world %d: %d tensors in the export, expected %d", world,
           f ? lpx_safetensors_count(f) : -1, want);
    for (int i = 0; f && i < NP + (nf4 ? 1 : 0); i++) {
        char name[64];
        if (rename_ && i >= NP - 1) break;
        if (rename_) snprintf(name, sizeof name, "p%d", i);
        else if (i == NP) snprintf(name, sizeof name, "block0/3/base");
        else snprintf(name, sizeof name, "%s/%d/%s", i ? "block0" : "emb", i ? i - 1 : 0, i == 3 ? "norm" : "w");
        lpx_tensor *t = NULL, *ref = NULL, *refc = NULL;
        CHECK_OK(lpx_safetensors_get(f, name, &t));
        CHECK_OK(lpx_cast(i == NP ? deq : c.full[i], dtype, false, &ref));
        CHECK_OK(lpx_contiguous(ref, &refc));
        bool ok = t && refc && lpx_tensor_dtype(t) == dtype && lpx_tensor_numel(t) == lpx_tensor_numel(refc) &&
                  lpx_tensor_ndim(t) == 2 && !memcmp(lpx_tensor_data(t), lpx_tensor_data(refc),
                                                      lpx_dtype_nbytes(dtype, lpx_tensor_numel(refc)));
        CHECKF(ok, "world %d, %s export: '%s' differs from the model's values", world, lpx_dtype_name(dtype), name);
        lpx_tensor_release(t);
        lpx_tensor_release(ref);
        lpx_tensor_release(refc);
    }
    lpx_safetensors_close(f);
    lpx_tensor_release(x);
    lpx_tensor_release(deq);
    ctx_free(&c);
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp-export", path);
    struct stat sb;
    CHECK(stat(tmp, &sb) != 0);
}

/* Import, the inverse: a model exported on 3 ranks (f32; bf16 rounded)
 * read back into a zeroed model on 1, 2, 4 and 8 ranks, each rank reading
 * its rows only: every parameter (a bf16 one, a float8_weight's master)
 * equals the exported values bit for bit. */
static void test_import_consolidated(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/import.safetensors", root);
    ck_ctx e;
    ctx_init(&e, NULL);
    e.export_path = path;
    e.export_dtype = LPX_F32;
    run_ranks(3, ck_rank, &e);
    static const int ws[] = {1, 2, 4, 8};
    for (size_t w = 0; w < sizeof ws / sizeof *ws; w++) {
        ck_ctx c;
        ctx_init(&c, NULL);
        c.import_path = path;
        c.zeros = true;
        run_ranks(ws[w], ck_rank, &c);
        for (int i = 0; i < NP; i++) {
            float *want = calloc((size_t)numel2(shapes[i]), sizeof(float));
            to_f32(e.full[i], want);
            CHECKF(!memcmp(want, c.img[i], (size_t)numel2(shapes[i]) * sizeof(float)),
                   "imported on %d ranks: param %d differs from the exported model", ws[w], i);
            free(want);
        }
        ctx_free(&c);
    }
    /* refused: a name the file lacks (renamed when read), an NF4 base */
    ck_ctx r;
    ctx_init(&r, NULL);
    r.import_path = path;
    r.zeros = r.export_rename = r.expect_fail = true;
    run_ranks(2, ck_rank, &r);
    CHECKF(r.st[0] == LPX_EINVAL && r.st[1] == LPX_EINVAL && any_says(&r, 2, "no tensor 'p0'"), "renamed: %s", r.msg[0]);
    ctx_free(&r);
    int64_t s[2] = {NF4_ROWS, 64};
    ck_ctx q;
    ctx_init(&q, NULL);
    lpx_tensor *x = rand_normal(2, s, 77, 1.0, LPX_F32);
    CHECK_OK(lpx_nf4_quantize(x, NULL, &q.nf4));
    q.with_nf4 = true;
    q.export_path = path;
    q.export_dtype = LPX_F32;
    run_ranks(2, ck_rank, &q);   /* the NF4 base exported dequantized */
    q.export_path = NULL;
    q.import_path = path;
    q.expect_fail = true;
    run_ranks(2, ck_rank, &q);
    CHECKF(q.st[0] == LPX_ENOTIMPL && any_says(&q, 2, "cannot be cut from rows"), "nf4: %s", q.msg[0]);
    lpx_tensor_release(x);
    ctx_free(&q);
    ctx_free(&e);
}

static void test_export_consolidated(void)
{
    for (int w = 0; w < NWORLDS; w++) check_export(worlds[w], LPX_F32, false, false);
    check_export(3, LPX_BF16, false, false);
    check_export(4, LPX_F32, true, false);
    check_export(3, LPX_F32, false, true);
    check_export(8, LPX_BF16, false, true);
    /* refusals: a dtype, two parameters under one name */
    ck_ctx c;
    ctx_init(&c, NULL);
    char path[300];
    snprintf(path, sizeof path, "%s/export-bad.safetensors", root);
    c.export_path = path;
    c.export_dtype = LPX_F8E4M3FN;
    c.expect_fail = true;
    run_ranks(2, ck_rank, &c);
    CHECKF(c.st[0] == LPX_EINVAL && c.st[1] == LPX_EINVAL && strstr(c.msg[0], "f32 or bf16"), "dtype: %s", c.msg[0]);
    ctx_free(&c);
    CHECK_ERR(lpx_fsdp_export(NULL, path, LPX_F32, NULL, NULL, 0, NULL), LPX_EINVAL);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/lpx-ckpt-XXXXXX");
    if (!mkdtemp(root)) {
        printf("mkdtemp failed\n");
        return 1;
    }
    RUN(test_reshard_every_world_pair);
    RUN(test_nf4_recut_across_worlds);
    RUN(test_damage_refused);
    RUN(test_user_and_extras);
    RUN(test_dense_master_interchange);
    RUN(test_export_consolidated);
    RUN(test_import_consolidated);
    RUN(test_hybrid_mesh);
    RUN(test_sigkill_during_saves);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    return CHECK_DONE();
}
