/* What a sharded-checkpoint save may touch, and what a reader sees while
 * another job saves (issue "Nothing lost"; docs/RELIABILITY.md, "What a
 * save, a load and an output write promise"):
 *   - a save replaces only a whole lpx checkpoint: a folder holding an
 *     index.json and the user's files, a checkpoint with one extra file,
 *     a symbolic link (to a folder of files, or to a checkpoint), a user's
 *     folder named like the save's temporary: each refused, every file kept;
 *   - "ck/" and "ck" name one checkpoint (no "ck/.tmp" inside it);
 *   - lpx_fsdp_save_check refuses a missing or non-folder parent;
 *   - a save waits while the checkpoint it replaces is open for reading,
 *     so a reader never mixes two checkpoints; a second concurrent save
 *     into the same directory is refused, not interleaved.
 * One rank of the local comm; each case in a scratch folder under /tmp. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dt_util.h"

/* (dt_util.h's rank-failure recorder: unused here, the ranks report through sv_ctx) */
static void (*const keep_rfail)(int, const char *, ...) __attribute__((unused)) = rfail;

static char root[256];

typedef struct sv_ctx {
    const char *dir;
    float value;       /* every element of the one parameter */
    lpx_status st;
    char msg[512];
} sv_ctx;

/* one rank: a [8, 4] f32 parameter of `value`, saved to dir */
static lpx_status save_rank(lpx_comm *comm, void *arg)
{
    sv_ctx *c = arg;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_tensor *w = NULL;
    int64_t s[2] = {8, 4};
    lpx_status st = new_engine(comm, NULL, &f);
    if (!st) st = lpx_fsdp_group_add(f, "g", &g);
    if (!st) st = lpx_full(2, s, c->value, LPX_F32, lpx_cpu(), &w);
    if (!st) st = lpx_fsdp_param_add(g, "w", w, 0, NULL);
    if (!st) st = lpx_fsdp_shard(f);
    if (!st) st = lpx_fsdp_save(f, c->dir);
    c->st = st;
    snprintf(c->msg, sizeof c->msg, "%s", st ? lpx_last_error() : "");
    lpx_tensor_release(w);
    lpx_fsdp_free(f);
    return LPX_OK;   /* the status is the test's to check */
}

static lpx_status save(const char *dir, float value, char *msg, size_t len)
{
    sv_ctx c = {.dir = dir, .value = value};
    lpx_status sts[1];
    lpx_status st = lpx_local_run(1, save_rank, &c, 120000, sts);
    if (st) return st;
    if (msg) snprintf(msg, len, "%s", c.msg);
    return c.st;
}

static int sh(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b ? b : "");
    return system(cmd);
}

static bool exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* a save into dir is refused with needle in its message, and the files
 * of keep (a shell glob list) are all still there */
static void refused(const char *what, const char *dir, const char *needle)
{
    char msg[512] = "";
    lpx_status st = save(dir, 1.0f, msg, sizeof msg);
    CHECKF(st != LPX_OK && strstr(msg, needle), "%s: save returned %s: '%s'", what, lpx_status_string(st), msg);
    CHECKF(lpx_fsdp_save_check(dir) != LPX_OK, "%s: lpx_fsdp_save_check accepted it", what);
}

static void test_save_replaces_only_a_checkpoint(void)
{
    char d[512], p[600];
    /* a folder with an index.json of its own and the user's files */
    snprintf(d, sizeof d, "%s/user", root);
    CHECK(sh("mkdir -p '%s' && echo '{}' > '%s/index.json'", d, d) == 0);
    CHECK(sh("echo mine > '%s/notes.txt'", d, NULL) == 0);
    refused("index.json + notes.txt", d, "is not an lpx checkpoint");
    snprintf(p, sizeof p, "%s/notes.txt", d);
    CHECKF(exists(p), "the user's notes.txt is gone");

    /* a real checkpoint with one file added by the user */
    snprintf(d, sizeof d, "%s/ck", root);
    char msg[512];
    CHECKF(save(d, 1.0f, msg, sizeof msg) == LPX_OK, "first save: %s", msg);
    CHECKF(save(d, 2.0f, msg, sizeof msg) == LPX_OK, "second save over a checkpoint: %s", msg);
    CHECK(sh("echo mine > '%s/README'", d, NULL) == 0);
    refused("checkpoint + README", d, "holds 'README'");
    snprintf(p, sizeof p, "%s/README", d);
    CHECKF(exists(p), "README is gone");
    snprintf(p, sizeof p, "%s/index.json", d);
    CHECKF(exists(p), "the checkpoint's index is gone");

    /* a symbolic link to a folder of files, and to a checkpoint: refused,
     * the target untouched (a remove never walks through a link) */
    char t[512], l[512];
    snprintf(t, sizeof t, "%s/target", root);
    snprintf(l, sizeof l, "%s/link", root);
    CHECK(sh("mkdir -p '%s' && touch '%s/index.json'", t, t) == 0);
    CHECK(sh("touch '%s/a.bin'", t, NULL) == 0);
    CHECK(symlink(t, l) == 0);
    refused("link to a folder", l, "is a symbolic link");
    snprintf(p, sizeof p, "%s/a.bin", t);
    CHECKF(exists(p), "the link target's a.bin is gone");
    char l2[512], ck2[512];
    snprintf(ck2, sizeof ck2, "%s/ck2", root);
    snprintf(l2, sizeof l2, "%s/link2", root);
    CHECKF(save(ck2, 1.0f, msg, sizeof msg) == LPX_OK, "save ck2: %s", msg);
    CHECK(symlink(ck2, l2) == 0);
    refused("link to a checkpoint", l2, "is a symbolic link");
    snprintf(p, sizeof p, "%s/index.json", ck2);
    CHECKF(exists(p), "the linked checkpoint is gone");
    struct stat sb;
    CHECKF(lstat(l2, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced");

    /* a user's folder named like the save's temporary, or its .old */
    snprintf(d, sizeof d, "%s/fresh", root);
    CHECK(sh("mkdir -p '%s.tmp' && echo mine > '%s.tmp/photo.jpg'", d, d) == 0);
    refused("user folder at <dir>.tmp", d, "holds 'photo.jpg'");
    snprintf(p, sizeof p, "%s.tmp/photo.jpg", d);
    CHECKF(exists(p), "<dir>.tmp/photo.jpg is gone");
    snprintf(d, sizeof d, "%s/fresh2", root);
    CHECK(sh("mkdir -p '%s.old' && echo mine > '%s.old/photo.jpg'", d, d) == 0);
    refused("user folder at <dir>.old", d, "holds 'photo.jpg'");
    snprintf(p, sizeof p, "%s.old/photo.jpg", d);
    CHECKF(exists(p), "<dir>.old/photo.jpg is gone");

    /* a leftover of a save that died (its own names only) is cleared */
    snprintf(d, sizeof d, "%s/died", root);
    CHECK(sh("mkdir -p '%s.tmp' && touch '%s.tmp/rank-00000-of-00002.safetensors.tmp.Ab12Cd'", d, d) == 0);
    CHECKF(save(d, 1.0f, msg, sizeof msg) == LPX_OK, "save over a dead save's leftover: %s", msg);
    snprintf(p, sizeof p, "%s.tmp", d);
    CHECKF(!exists(p), "the leftover temporary is still there");
}

static void test_trailing_slash_and_parent(void)
{
    char d[512], p[600], msg[512];
    snprintf(d, sizeof d, "%s/slash/", root);
    CHECKF(save(d, 1.0f, msg, sizeof msg) == LPX_OK, "save to 'slash/': %s", msg);
    CHECKF(save(d, 2.0f, msg, sizeof msg) == LPX_OK, "second save to 'slash/': %s", msg);
    snprintf(p, sizeof p, "%s/slash/index.json", root);
    CHECKF(exists(p), "no index in slash/");
    snprintf(p, sizeof p, "%s/slash/.tmp", root);
    CHECKF(!exists(p), "a temporary was made inside the checkpoint");
    snprintf(p, sizeof p, "%s/slash.tmp", root);
    CHECKF(!exists(p), "slash.tmp left behind");

    snprintf(d, sizeof d, "%s/no/such/parent", root);
    CHECK(lpx_fsdp_save_check(d) == LPX_EINVAL && strstr(lpx_last_error(), "does not exist"));
    snprintf(p, sizeof p, "%s/afile", root);
    CHECK(sh("touch '%s'", p, NULL) == 0);
    snprintf(d, sizeof d, "%s/afile/ck", root);
    CHECK(lpx_fsdp_save_check(d) == LPX_EINVAL && strstr(lpx_last_error(), "is not a folder"));
    snprintf(d, sizeof d, "%s/absent", root);
    CHECKF(lpx_fsdp_save_check(d) == LPX_OK, "an absent dir with a writable parent: %s", lpx_last_error());
    CHECKF(!exists(d), "the check made the directory");
}

/* the value every element of the checkpoint's parameter has (a reader's view) */
static float saved_value(lpx_fsdp_ckpt *c, const char *dir)
{
    (void)c;
    char path[600];
    snprintf(path, sizeof path, "%s/rank-00000-of-00001.safetensors", dir);
    lpx_safetensors *sf = NULL;
    lpx_tensor *t = NULL;
    float v = -1;
    if (!lpx_safetensors_open(path, &sf) && !lpx_safetensors_get(sf, "g/0/w", &t)) v = ((float *)lpx_tensor_data(t))[0];
    lpx_tensor_release(t);
    lpx_safetensors_close(sf);
    return v;
}

typedef struct bg_save {
    const char *dir;
    float value;
    lpx_status st;
    char msg[512];
} bg_save;

static void *bg_saver(void *arg)
{
    bg_save *b = arg;
    b->st = save(b->dir, b->value, b->msg, sizeof b->msg);
    return NULL;
}

static void test_save_waits_for_readers(void)
{
    char d[512], msg[512];
    snprintf(d, sizeof d, "%s/busy", root);
    CHECKF(save(d, 1.0f, msg, sizeof msg) == LPX_OK, "save 1: %s", msg);
    lpx_fsdp_ckpt *c = NULL;
    CHECK_OK(lpx_fsdp_ckpt_open(d, &c));
    bg_save b = {.dir = d, .value = 2.0f};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, bg_saver, &b) == 0);
    /* while the reader holds it, the directory still is checkpoint 1:
     * everything the reader opens now belongs to the index it read */
    struct timespec nap = {0, 300 * 1000 * 1000};
    nanosleep(&nap, NULL);
    float v = saved_value(c, d);
    CHECKF(v == 1.0f, "a save replaced the checkpoint under an open reader (it reads %g)", v);
    lpx_fsdp_ckpt_close(c);
    pthread_join(th, NULL);
    CHECKF(b.st == LPX_OK, "the waiting save: %s", b.msg);
    CHECKF(saved_value(NULL, d) == 2.0f, "after the reader closed, the save did not land");

    /* two saves into one directory at once: one of them is refused, and
     * the directory holds one whole checkpoint */
    CHECK_OK(lpx_fsdp_ckpt_open(d, &c));   /* holds the second save at its commit */
    bg_save b1 = {.dir = d, .value = 3.0f};
    CHECK(pthread_create(&th, NULL, bg_saver, &b1) == 0);
    nanosleep(&nap, NULL);
    lpx_status st = save(d, 4.0f, msg, sizeof msg);
    CHECKF(st != LPX_OK && strstr(msg, "another save into"), "a concurrent save: %s '%s'", lpx_status_string(st), msg);
    lpx_fsdp_ckpt_close(c);
    pthread_join(th, NULL);
    CHECKF(b1.st == LPX_OK, "the first save: %s", b1.msg);
    CHECKF(saved_value(NULL, d) == 3.0f, "the directory holds %g, not the first save's 3", saved_value(NULL, d));
}

int main(void)
{
    CHECK_OK(lpx_init());
    snprintf(root, sizeof root, "/tmp/lpx-test-ckpt-safety.%ld", (long)getpid());
    mkdir(root, 0777);
    RUN(test_save_replaces_only_a_checkpoint);
    RUN(test_trailing_slash_and_parent);
    RUN(test_save_waits_for_readers);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return CHECK_DONE();
}
