/* What the sharded checkpoint's save, load, reader and export share
 * (fsdp_ckpt_internal.h): file names, checksums, the index, the
 * collective agreement. */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fsdp_ckpt_internal.h"

/* (callers keep dir below CK_PATH - 64 bytes, so nothing is cut) */
void ck_key(const lpx_fsdp_group *g, int i, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%d/%s", lpx_fsdp_group_name(g), i, lpx_fsdp_param_name(g, i));
}

void ck_rank_file(char *buf, size_t len, const char *dir, int rank, int world)
{
    if (snprintf(buf, len, "%s/rank-%05d-of-%05d.safetensors", dir, rank, world) >= (int)len) buf[0] = 0;
}

lpx_status ck_fnv_of_file(const char *path, ck_file *out)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return lpx_error(LPX_EIO, "checkpoint %s: open: %s", path, strerror(errno));
    /* FNV-1a 64 over the file's 8-byte little-endian words, then its tail
     * bytes: one multiply per word keeps the read-back pass near memory
     * speed (docs/CHECKPOINT.md) */
    uint64_t h = 1469598103934665603ull, n = 0;
    /* large reads, the kernel's sequential readahead, and the next 64 MiB
     * asked for ahead of the hash (POSIX_FADV_WILLNEED on a moving window,
     * so a file larger than memory is not pulled in at once): from a cold
     * cache, 64 KiB reads left the disk at a fraction of a plain 8 MiB read
     * (lpx bench ckpt, "from disk": 0.45-0.50x of it, now 0.67-0.91x) */
    const size_t cap = (size_t)1 << 20;
    const uint64_t window = (uint64_t)64 << 20;
    uint64_t advised = 0;
    unsigned char *buf = lpx_malloc(cap);
    if (!buf) {
        close(fd);
        return lpx_error(LPX_ENOMEM, "checkpoint %s: no memory for a read buffer", path);
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t have = 0;
    for (;;) {
        if (n + window / 2 >= advised) {
            (void)posix_fadvise(fd, (off_t)advised, (off_t)window, POSIX_FADV_WILLNEED);
            advised += window;
        }
        ssize_t r = read(fd, buf + have, cap - have);
        if (r < 0) {
            int e = errno;
            close(fd);
            lpx_free(buf);
            return lpx_error(LPX_EIO, "checkpoint %s: read: %s", path, strerror(e));
        }
        have += (size_t)r;
        n += (uint64_t)r;
        size_t words = r == 0 ? 0 : have / 8;
        for (size_t i = 0; i < words; i++) {
            uint64_t w;
            memcpy(&w, buf + 8 * i, 8);
            h = (h ^ w) * 1099511628211ull;
        }
        memmove(buf, buf + 8 * words, have - 8 * words);
        have -= 8 * words;
        if (r == 0) break;
    }
    for (size_t i = 0; i < have; i++) h = (h ^ buf[i]) * 1099511628211ull;
    lpx_free(buf);
    close(fd);
    out->bytes = n;
    out->fnv = h;
    return LPX_OK;
}

/* Every rank learns whether every rank succeeded: the lowest failing
 * rank's status is returned everywhere (its own message on that rank;
 * the others say which rank failed). Allocates nothing, so a rank that
 * ran out of memory still takes part: two all-reduces of one value. A
 * comm failure is returned as is. */
uint64_t ck_fnv_text(const char *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001B3ull;
    return h;
}

char *ck_sum_digits(char *text)
{
    static const char key[] = "\"checksum\":";
    char *k = strstr(text, key);
    if (!k || strstr(k + 1, key)) return NULL;
    char *q = strchr(k + strlen(key), '"');
    if (!q || strlen(q) < 18 || q[17] != '"') return NULL;
    return q + 1;
}

lpx_status ck_agree(lpx_comm *comm, const char *what, lpx_status mine)
{
    int world = lpx_comm_size(comm), rank = lpx_comm_rank(comm);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mine ? lpx_last_error() : "");
    float who = mine ? (float)(world - rank) : 0.0f, code = 0.0f;
    lpx_status st = lpx_comm_all_reduce_buf(comm, &who, &who, 1, LPX_F32, LPX_REDUCE_MAX);
    if (st) return st;
    if (who == 0.0f) return LPX_OK;
    int first = world - (int)who;
    code = rank == first ? (float)-(int)mine : 0.0f;
    if ((st = lpx_comm_all_reduce_buf(comm, &code, &code, 1, LPX_F32, LPX_REDUCE_MAX))) return st;
    lpx_status out = (lpx_status)-(int)code;
    if (mine) return lpx_error(mine, "%s", msg);
    return lpx_error(out, "%s: rank %d failed (%s); see its error", what, first, lpx_status_string(out));
}

lpx_status ck_check_engine(const char *op, lpx_fsdp *f, ck_mesh *m)
{
    if (!f) return lpx_error(LPX_EINVAL, "%s: f is NULL", op);
    lpx_mesh *mesh = NULL;
    for (int gi = 0; gi < lpx_fsdp_group_count(f) && !mesh; gi++) {
        lpx_fsdp_group *g = lpx_fsdp_group_at(f, gi);
        for (int i = 0; i < lpx_fsdp_param_count(g) && !mesh; i++) {
            lpx_tensor *dt = lpx_fsdp_param_dtensor(g, i);
            if (!dt) return lpx_error(LPX_EINVAL, "%s: the engine is not sharded (call lpx_fsdp_shard first)", op);
            mesh = lpx_dtensor_mesh(dt);
        }
    }
    if (!mesh) return lpx_error(LPX_EINVAL, "%s: the engine has no parameters", op);
    for (int gi = 0; gi < lpx_fsdp_group_count(f); gi++)
        if (lpx_fsdp_is_unsharded(lpx_fsdp_group_at(f, gi)))
            return lpx_error(LPX_EINVAL, "%s: group '%s' is unsharded; reshard every group first", op,
                             lpx_fsdp_group_name(lpx_fsdp_group_at(f, gi)));
    /* a 2-D (hybrid) mesh shards over dim 1 and replicates over dim 0 */
    int nd = lpx_mesh_ndim(mesh);
    m->shard = lpx_mesh_comm(mesh, nd - 1);
    m->replica = nd == 2 ? lpx_mesh_comm(mesh, 0) : NULL;
    m->rank = lpx_comm_rank(m->shard);
    m->world = lpx_comm_size(m->shard);
    m->replica_rank = m->replica ? lpx_comm_rank(m->replica) : 0;
    return LPX_OK;
}

/* the index checksums' 16-bit pieces, MAX-reduced as themselves and as
 * their negations: equal everywhere iff max == min (f32 holds 16 bits
 * exactly); a rank that failed gives the neutral -1 and -65536 */
static lpx_status same_sum(lpx_comm *comm, bool failed, uint64_t sum, bool *same)
{
    float v[8];
    for (int i = 0; i < 4; i++) {
        float p = (float)((sum >> (16 * i)) & 0xFFFFu);
        v[i] = failed ? -1.0f : p;
        v[4 + i] = failed ? -65536.0f : -p;
    }
    lpx_status st = lpx_comm_all_reduce_buf(comm, v, v, 8, LPX_F32, LPX_REDUCE_MAX);
    *same = true;
    for (int i = 0; i < 4 && !st; i++) *same &= v[i] < 0 || v[i] == -v[4 + i];
    return st;
}

lpx_status ck_agree_index(const ck_mesh *m, const char *op, const char *dir, lpx_status mine, uint64_t sum)
{
    bool same = true, same_r = true;
    char msg[512];   /* the collectives clear this rank's message */
    snprintf(msg, sizeof msg, "%s", mine ? lpx_last_error() : "");
    lpx_status st = same_sum(m->shard, mine != LPX_OK, sum, &same);
    if (!st && m->replica) st = same_sum(m->replica, mine != LPX_OK, sum, &same_r);
    if (st) return st;
    if (mine) return lpx_error(mine, "%s", msg);
    if (!mine && !(same && same_r))
        return lpx_error(LPX_EIO, "%s: '%s': the ranks read two different checkpoints there (a save replaced it "
                         "between their reads); nothing was loaded, retry", op, dir);
    return mine;
}

lpx_status ck_agree_all(const ck_mesh *m, const char *what, lpx_status mine)
{
    lpx_status st = ck_agree(m->shard, what, mine);
    /* every shard group now holds its verdict; the replicas share theirs
     * (a failure's message rides along as this rank's own) */
    return m->replica ? ck_agree(m->replica, what, st) : st;
}

static lpx_status read_locked(const char *op, const char *path, ck_index *ix);

void ck_index_free(ck_index *ix)
{
    cJSON_Delete(ix->root);
    ix->root = NULL;
    if (ix->dirfd > 0) close(ix->dirfd);   /* releases the shared lock */
    ix->dirfd = -1;
}

/* dir opened and share-locked, the lock taken on the directory that dir
 * still names (a save's exchange between the open and the lock is seen,
 * and the new one opened instead); the open fd, or -1 with the error set */
static lpx_status open_locked(const char *op, const char *dir, int *out)
{
    *out = -1;
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return lpx_error(LPX_EIO, "%s: '%s': %s (not a checkpoint directory?)", op, dir, strerror(errno));
        int got = ck_flock_wait(fd, LOCK_SH, CK_READ_WAIT_MS);
        if (got == 0) {
            close(fd);
            return lpx_error(LPX_EIO, "%s: '%s': a save is in progress (it has held the directory for its commit "
                             "for %d s); retry when it ends", op, dir, CK_READ_WAIT_MS / 1000);
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            *out = fd;
            return LPX_OK;
        }
        close(fd);   /* replaced while we waited: read the new one */
    }
    return lpx_error(LPX_EIO, "%s: '%s' was replaced 100 times while it was opened; retry", op, dir);
}

lpx_status ck_read_index(const char *op, const char *dir, ck_index *ix)
{
    memset(ix, 0, sizeof *ix);
    ix->dirfd = -1;
    char path[CK_PATH], norm[CK_PATH - 64];
    lpx_status nst = ck_norm_dir(op, dir, norm, sizeof norm);
    if (nst) return nst;
    dir = norm;
    /* a save that crashed between its two renames (file systems that
     * cannot exchange directories) left the previous one at <dir>.old */
    struct stat sb;
    snprintf(ix->dir, sizeof ix->dir, "%s", dir);
    if (stat(dir, &sb) != 0 && errno == ENOENT) {
        snprintf(path, sizeof path, "%s.old", dir);
        if (stat(path, &sb) == 0) snprintf(ix->dir, sizeof ix->dir, "%s", path);
    }
    dir = ix->dir;
    if (snprintf(path, sizeof path, "%s/index.json", dir) >= (int)sizeof path)
        return lpx_error(LPX_EINVAL, "%s: dir path is too long", op);
    /* the directory stays locked (shared) until ck_index_free: a save's
     * commit waits for it, so every file read through ix->dir belongs to
     * this index */
    if ((nst = open_locked(op, dir, &ix->dirfd))) return nst;
    if ((nst = read_locked(op, path, ix))) ck_index_free(ix);
    return nst;
}

/* ck_read_index once the directory is locked */
static lpx_status read_locked(const char *op, const char *path, ck_index *ix)
{
    struct stat sb;
    int ifd = openat(ix->dirfd, "index.json", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (ifd >= 0 && (fstat(ifd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        close(ifd);
        return lpx_error(LPX_EIO, "%s: %s is not a regular file", op, path);
    }
    FILE *fp = ifd >= 0 ? fdopen(ifd, "rb") : NULL;
    if (!fp) {
        int e = errno;
        if (ifd >= 0) close(ifd);
        return lpx_error(LPX_EIO, "%s: %s: %s (not a checkpoint directory?)", op, path, strerror(e));
    }
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            if (cap > ((size_t)1 << 30)) {
                fclose(fp);
                lpx_free(text);
                return lpx_error(LPX_EINVAL, "%s: %s is larger than 1 GiB", op, path);
            }
            char *t = lpx_realloc(text, cap);
            if (!t) {
                fclose(fp);
                lpx_free(text);
                return lpx_error(LPX_ENOMEM, "%s: out of memory reading %s", op, path);
            }
            text = t;
        }
        size_t r = fread(text + n, 1, 4096, fp);
        n += r;
        if (r < 4096) break;
    }
    fclose(fp);
    text[n] = 0;
    /* the index's own checksum first: nothing in it is trusted before */
    char *d = ck_sum_digits(text);
    if (!d) {
        lpx_free(text);
        return lpx_error(LPX_EINVAL, "%s: %s has no checksum: not an lpx checkpoint index of version %d, or damaged",
                         op, path, CK_VERSION);
    }
    char want[17], got[17];
    memcpy(want, d, 16);
    want[16] = 0;
    memset(d, '0', 16);
    snprintf(got, sizeof got, "%016" PRIx64, ck_fnv_text(text, n));
    memcpy(d, want, 16);
    ix->sum = strtoull(want, NULL, 16);
    if (strcmp(got, want)) {
        lpx_free(text);
        return lpx_error(LPX_EINVAL, "%s: %s has checksum (FNV-1a 64) %s, it records %s: the index was edited or "
                         "damaged", op, path, got, want);
    }
    ix->root = cJSON_Parse(text);
    lpx_free(text);
    if (!ix->root) return lpx_error(LPX_EINVAL, "%s: %s is not valid JSON", op, path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(ix->root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(ix->root, "version");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(ix->root, "world");
    ix->files = cJSON_GetObjectItemCaseSensitive(ix->root, "files");
    ix->params = cJSON_GetObjectItemCaseSensitive(ix->root, "params");
    ix->extras = cJSON_GetObjectItemCaseSensitive(ix->root, "extras");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(ix->root, "user");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CK_FORMAT) || !cJSON_IsNumber(ver) ||
        ver->valuedouble != CK_VERSION || !cJSON_IsNumber(w) || w->valuedouble < 1 || w->valuedouble > 1 << 20 ||
        !cJSON_IsArray(ix->files) || !cJSON_IsArray(ix->params) ||
        cJSON_GetArraySize(ix->files) != (int)w->valuedouble || (ix->extras && !cJSON_IsArray(ix->extras)) ||
        (user && !cJSON_IsObject(user))) {
        cJSON_Delete(ix->root);
        ix->root = NULL;
        return lpx_error(LPX_EINVAL, "%s: %s is not an lpx checkpoint index of version %d (format, version, world, "
                         "files, params; extras and user where present)", op, path, CK_VERSION);
    }
    ix->world = (int)w->valuedouble;
    return LPX_OK;
}

lpx_status ck_open_rank(const char *op, ck_open *o, int r, lpx_safetensors **out)
{
    if (o->f[r]) {
        *out = o->f[r];
        return LPX_OK;
    }
    char path[CK_PATH];
    ck_rank_file(path, sizeof path, o->ix->dir, r, o->ix->world);
    const cJSON *fe = cJSON_GetArrayItem(o->ix->files, r), *b = cJSON_GetObjectItemCaseSensitive(fe, "bytes");
    struct stat sb;
    if (stat(path, &sb)) return lpx_error(LPX_EIO, "%s: %s: %s (a rank's file is missing)", op, path, strerror(errno));
    if (!cJSON_IsNumber(b) || (double)sb.st_size != b->valuedouble)
        return lpx_error(LPX_EIO, "%s: %s has %lld bytes, the index says %.0f: the file was changed or truncated", op,
                         path, (long long)sb.st_size, cJSON_IsNumber(b) ? b->valuedouble : -1.0);
    if (o->verify) {
        /* the bytes the index was written from: one read of the file */
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(fe, "fnv1a64");
        ck_file got;
        char hex[32];
        lpx_status st = ck_fnv_of_file(path, &got);
        if (st) return st;
        snprintf(hex, sizeof hex, "%016" PRIx64, got.fnv);
        if (!cJSON_IsString(h) || strcmp(h->valuestring, hex))
            return lpx_error(LPX_EIO, "%s: %s has checksum (FNV-1a 64) %s, the index says %s: the file was changed "
                             "or damaged", op, path, hex, cJSON_IsString(h) ? h->valuestring : "none");
    }
    lpx_status st = lpx_safetensors_open(path, &o->f[r]);
    if (!st) *out = o->f[r];
    return st;
}
