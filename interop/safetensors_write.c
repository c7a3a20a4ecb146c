/* safetensors writing (include/lpx/safetensors.h; reading is
 * safetensors_read.c): every tensor (a kind tensor as its inner tensors,
 * named "name::kind::inner") into one file, written to a temporary name,
 * synced and renamed, so a crash leaves the old file or the new one. */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "lpx/lpx.h"
#include "lpx/safetensors.h"
#include "lpx/dlpack.h"
#include "core/lpx_internal.h"
#include "safetensors_internal.h"

/* ---- writing */

typedef struct wr_item {
    char *name;             /* full stored name */
    lpx_tensor *t;          /* dense CPU contiguous, one reference */
    uint64_t begin, end;
} wr_item;

/* FNV-1a 64 over a byte stream's 8-byte little-endian words, then its
 * tail bytes (the sharded checkpoint's file checksum), fed as written. */
typedef struct wr_hash {
    uint64_t h, n;
    unsigned char carry[8];
    int nc;
} wr_hash;

static void hash_feed(wr_hash *x, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    x->n += n;
    while (n && x->nc) {   /* complete a word begun by the last write */
        x->carry[x->nc++] = *p++;
        n--;
        if (x->nc == 8) {
            uint64_t w;
            memcpy(&w, x->carry, 8);
            x->h = (x->h ^ w) * 1099511628211ull;
            x->nc = 0;
        }
    }
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        x->h = (x->h ^ w) * 1099511628211ull;
    }
    p += 8 * words;
    n -= 8 * words;
    for (size_t i = 0; i < n; i++) x->carry[x->nc++] = p[i];
}

static uint64_t hash_final(const wr_hash *x)
{
    uint64_t h = x->h;
    for (int i = 0; i < x->nc; i++) h = (h ^ x->carry[i]) * 1099511628211ull;
    return h;
}

/* Where a file's bytes go: the descriptor, its name for messages, the
 * running checksum (or NULL), and how far it is written and handed to the
 * kernel's writeback. */
typedef struct wr_out {
    int fd;
    const char *path;
    wr_hash *hash;
    uint64_t off, kicked;
} wr_out;

/* Writes buf one chunk at a time: the checksum (when asked) takes the
 * chunk just before it is written, so the write's copy into the page cache
 * reads bytes the hash has just brought into the CPU's cache instead of a
 * second pass over a tensor larger than the cache; and every WR_KICK bytes
 * the kernel is asked to start writing them back (Linux
 * sync_file_range(SYNC_FILE_RANGE_WRITE), which does not wait), so the
 * disk works while later bytes are copied instead of all at the final
 * fsync. Errors of the writeback surface at that fsync. */
#define WR_CHUNK ((size_t)1 << 20)
#define WR_KICK ((uint64_t)8 << 20)

static lpx_status write_all(wr_out *o, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        size_t c = n < WR_CHUNK ? n : WR_CHUNK;
        if (o->hash) hash_feed(o->hash, p, c);
        size_t left = c;
        while (left) {
            ssize_t w = write(o->fd, p, left);
            if (w < 0) {
                if (errno == EINTR) continue;
                return lpx_error(LPX_EIO, "safetensors %s: write: %s", o->path, strerror(errno));
            }
            p += w;
            left -= (size_t)w;
        }
        n -= c;
        o->off += c;
#ifdef __linux__
        if (o->off - o->kicked >= WR_KICK) {
            (void)sync_file_range(o->fd, (off_t)o->kicked, (off_t)(o->off - o->kicked), SYNC_FILE_RANGE_WRITE);
            o->kicked = o->off;
        }
#endif
    }
    return LPX_OK;
}

static int cmp_items(const void *a, const void *b)
{
    /* larger elements first, so every tensor starts aligned to its element
     * size with no gaps (the layout the reference writer uses) */
    const wr_item *x = a, *y = b;
    int bx = lpx_dtype_get(lpx_tensor_dtype(x->t))->bits, by = lpx_dtype_get(lpx_tensor_dtype(y->t))->bits;
    if (bx != by) return by - bx;
    return strcmp(x->name, y->name);
}

static char *join3(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + (c ? strlen(c) + 2 : 0) + 3;
    char *s = lpx_malloc(n);
    if (s) {
        if (c) snprintf(s, n, "%s" SEP "%s" SEP "%s", a, b, c);
        else snprintf(s, n, "%s" SEP "%s", a, b);
    }
    return s;
}

static lpx_status add_item(wr_item *items, int *nitems, const char *name, lpx_tensor *t)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(t));
    if (!lpx_safetensors_dtype_name(lpx_tensor_dtype(t)))
        return lpx_error(LPX_EDTYPE, "lpx_safetensors_save: tensor '%s' has dtype %s, which safetensors cannot name",
                         name, tr->name);
    if (lpx_tensor_device(t).type != LPX_DEVICE_CPU)
        return lpx_error(LPX_EDEVICE, "lpx_safetensors_save: tensor '%s' is not on the CPU", name);
    lpx_tensor *c = NULL;
    lpx_status st;
    if (lpx_tensor_is_contiguous(t)) {
        lpx_tensor_retain(t);
        c = t;
    } else if ((st = lpx_contiguous(t, &c))) {
        return st;
    }
    items[*nitems].name = (char *)name;
    items[*nitems].t = c;
    (*nitems)++;
    return LPX_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the first string of s[0..n) that appears twice (sorted: a repeat is
 * adjacent), or *twice = NULL */
static lpx_status first_repeat(const char *const *s, int n, const char **twice)
{
    *twice = NULL;
    if (n < 2) return LPX_OK;
    const char **c = lpx_malloc((size_t)n * sizeof *c);
    if (!c) return lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory");
    memcpy(c, s, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_str);
    for (int i = 1; i < n && !*twice; i++)
        if (!strcmp(c[i], c[i - 1])) *twice = c[i];
    lpx_free(c);
    return LPX_OK;
}

lpx_status lpx_safetensors_save(const char *path, int n, const char *const *names, lpx_tensor *const *tensors,
                                int nmeta, const lpx_safetensors_kv *meta)
{
    return lpx__st_save_hashed(path, n, names, tensors, nmeta, meta, false, NULL, NULL);
}

lpx_status lpx__st_save_hashed(const char *named, int n, const char *const *names, lpx_tensor *const *tensors,
                               int nmeta, const lpx_safetensors_kv *meta, bool in_place, uint64_t *bytes, uint64_t *fnv)
{
    wr_hash hash = {1469598103934665603ull, 0, {0}, 0}, *hp = bytes || fnv ? &hash : NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    /* the file actually written: a link's target; a FIFO, device or
     * directory refused before anything is made (lpx_output_path). In
     * place: a file inside a checkpoint's own temporary directory. */
    char resolved[PATH_MAX];
    const char *path = named;
    if (named && !in_place) {
        if ((st = lpx_output_path("lpx_safetensors_save", named, resolved, sizeof resolved))) return st;
        path = resolved;
    }
    if (!path || n < 0 || (n && (!names || !tensors)) || nmeta < 0 || (nmeta && !meta))
        return lpx_error(LPX_EINVAL, "lpx_safetensors_save: NULL path/names/tensors/meta or negative count");
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] || !tensors[i])
            return lpx_error(LPX_EINVAL, "lpx_safetensors_save: tensor %d has a NULL/empty name or is NULL", i);
        if (strstr(names[i], SEP) || !strcmp(names[i], "__metadata__"))
            return lpx_error(LPX_EINVAL, "lpx_safetensors_save: tensor name '%s' is reserved (contains '::' or is "
                             "__metadata__)", names[i]);
    }
    /* repeated names and keys, by sorting (O(n log n), not pairwise) */
    const char *twice = NULL;
    lpx_status dst = first_repeat(names, n, &twice);
    if (dst) return dst;
    if (twice) return lpx_error(LPX_EINVAL, "lpx_safetensors_save: tensor name '%s' appears twice", twice);
    for (int i = 0; i < nmeta; i++) {
        if (!meta[i].key || !meta[i].value)
            return lpx_error(LPX_EINVAL, "lpx_safetensors_save: metadata entry %d has a NULL key or value", i);
        if (strstr(meta[i].key, SEP))
            return lpx_error(LPX_EINVAL, "lpx_safetensors_save: metadata key '%s' is reserved (contains '::')", meta[i].key);
    }
    if (nmeta) {
        const char **keys = lpx_calloc((size_t)nmeta, sizeof *keys);
        if (!keys) return lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory");
        for (int i = 0; i < nmeta; i++) keys[i] = meta[i].key;
        dst = first_repeat(keys, nmeta, &twice);
        lpx_free(keys);
        if (dst) return dst;
        if (twice) return lpx_error(LPX_EINVAL, "lpx_safetensors_save: metadata key '%s' appears twice", twice);
    }
    size_t cap = (size_t)n * LPX_MAX_INNER + 1;
    wr_item *items = lpx_calloc(cap, sizeof *items);
    char **owned = lpx_calloc(cap, sizeof *owned);
    int nitems = 0, nowned = 0;
    cJSON *root = cJSON_CreateObject(), *jm = NULL;
    char *hdr = NULL, *tmp = NULL;
    int fd = -1;
    if (!items || !owned || !root) { st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory"); goto fail; }
    if (nmeta || n) jm = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; i < nmeta; i++)
        if (!cJSON_AddStringToObject(jm, meta[i].key, meta[i].value)) { st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory"); goto fail; }
    for (int i = 0; i < n; i++) {
        lpx_tensor *t = tensors[i];
        const lpx_kind *k = lpx_tensor_kind(t);
        if (!k) {
            if ((st = add_item(items, &nitems, names[i], t))) goto fail;
            continue;
        }
        const char *kn = lpx_kind_name(k);
        cJSON *d = cJSON_CreateObject(), *inn = NULL, *shp = NULL;
        if (!d) { st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory"); goto fail; }
        cJSON_AddStringToObject(d, "kind", kn);
        cJSON_AddStringToObject(d, "dtype", lpx_dtype_name(lpx_tensor_dtype(t)));
        shp = cJSON_AddArrayToObject(d, "shape");
        inn = cJSON_AddArrayToObject(d, "inner");
        for (int j = 0; shp && j < lpx_tensor_ndim(t); j++) {
            char num[32];
            snprintf(num, sizeof num, "%lld", (long long)lpx_tensor_shape(t)[j]);
            cJSON_AddItemToArray(shp, cJSON_CreateRaw(num));
        }
        size_t ms;
        const unsigned char *mb = lpx_tensor_meta(t, &ms);
        char hex[2 * LPX_MAX_META + 1];
        for (size_t j = 0; j < ms; j++) snprintf(hex + 2 * j, 3, "%02x", mb[j]);
        hex[2 * ms] = 0;
        cJSON_AddStringToObject(d, "meta", hex);
        for (int j = 0; j < lpx_tensor_inner_count(t); j++) {
            char in[32];
            lpx_tensor *it = lpx_tensor_inner(t, j);
            lpx_kind_inner_name(k, j, in, sizeof in);
            cJSON_AddItemToArray(inn, cJSON_CreateString(in));
            if (lpx_tensor_kind(it)) {
                cJSON_Delete(d);
                st = lpx_error(LPX_EINVAL, "lpx_safetensors_save: tensor '%s' (%s): inner tensor '%s' is itself of kind "
                               "'%s' (nested kinds are not stored)", names[i], kn, in, lpx_kind_name(lpx_tensor_kind(it)));
                goto fail;
            }
            char *full = join3(names[i], kn, in);
            if (!full) { cJSON_Delete(d); st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory"); goto fail; }
            owned[nowned++] = full;
            if ((st = add_item(items, &nitems, full, it))) { cJSON_Delete(d); goto fail; }
        }
        char *ds = cJSON_PrintUnformatted(d);
        cJSON_Delete(d);
        char *key = join3(names[i], kn, NULL);
        if (key) owned[nowned++] = key;
        if (!ds || !key || !cJSON_AddStringToObject(jm, key, ds)) {
            cJSON_free(ds);
            st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory");
            goto fail;
        }
        cJSON_free(ds);
    }
    if (jm && !cJSON_GetArraySize(jm)) cJSON_DeleteItemFromObject(root, "__metadata__");
    qsort(items, (size_t)nitems, sizeof *items, cmp_items);
    uint64_t off = 0;
    for (int i = 0; i < nitems; i++) {
        lpx_tensor *t = items[i].t;
        items[i].begin = off;
        off += lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
        items[i].end = off;
        cJSON *e = cJSON_CreateObject(), *shp = e ? cJSON_AddArrayToObject(e, "shape") : NULL,
              *ofs = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        if (!e || !shp || !ofs || !cJSON_AddStringToObject(e, "dtype", lpx_safetensors_dtype_name(lpx_tensor_dtype(t)))) {
            cJSON_Delete(e);
            st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory");
            goto fail;
        }
        char num[32];
        for (int j = 0; j < lpx_tensor_ndim(t); j++) {
            snprintf(num, sizeof num, "%lld", (long long)lpx_tensor_shape(t)[j]);
            cJSON_AddItemToArray(shp, cJSON_CreateRaw(num));
        }
        snprintf(num, sizeof num, "%llu", (unsigned long long)items[i].begin);
        cJSON_AddItemToArray(ofs, cJSON_CreateRaw(num));
        snprintf(num, sizeof num, "%llu", (unsigned long long)items[i].end);
        cJSON_AddItemToArray(ofs, cJSON_CreateRaw(num));
        cJSON_AddItemToObject(root, items[i].name, e);
    }
    hdr = cJSON_PrintUnformatted(root);
    if (!hdr) { st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory"); goto fail; }
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    if (padded > LPX_SAFETENSORS_MAX_HEADER) {
        st = lpx_error(LPX_EINVAL, "lpx_safetensors_save: the header would be %zu bytes, over the limit of %u",
                       padded, LPX_SAFETENSORS_MAX_HEADER);
        goto fail;
    }
    /* temporary file in the target's directory (in place: the file
     * itself, whose directory the caller commits) */
    size_t pl = strlen(path);
    tmp = lpx_malloc(pl + 16);
    if (!tmp) { st = lpx_error(LPX_ENOMEM, "lpx_safetensors_save: out of memory"); goto fail; }
    snprintf(tmp, pl + 16, in_place ? "%s" : "%s.tmp.XXXXXX", path);
    fd = in_place ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        st = lpx_error(LPX_EIO, "safetensors %s: cannot create a temporary file next to it: %s", path, strerror(errno));
        lpx_free(tmp);
        tmp = NULL;
        goto fail;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    wr_out out = {fd, tmp, hp, 0, 0};
    if ((st = write_all(&out, len8, 8)) || (st = write_all(&out, hdr, hl))) goto fail;
    for (size_t i = hl; i < padded; i++)
        if ((st = write_all(&out, " ", 1))) goto fail;
    for (int i = 0; i < nitems; i++)
        if ((st = write_all(&out, lpx_tensor_data(items[i].t), (size_t)(items[i].end - items[i].begin)))) goto fail;
    if (fsync(fd)) { st = lpx_error(LPX_EIO, "safetensors %s: fsync: %s", tmp, strerror(errno)); goto fail; }
    if (fchmod(fd, 0644)) { st = lpx_error(LPX_EIO, "safetensors %s: fchmod: %s", tmp, strerror(errno)); goto fail; }
    if (close(fd)) { fd = -1; st = lpx_error(LPX_EIO, "safetensors %s: close: %s", tmp, strerror(errno)); goto fail; }
    fd = -1;
    if (!in_place && rename(tmp, path)) {
        st = lpx_error(LPX_EIO, "safetensors %s: rename: %s", path, strerror(errno));
        goto fail;
    }
    lpx_free(tmp);
    tmp = NULL;
    if (!in_place) {
        /* make the rename durable */
        char *dir = lpx_strdup(path);
        if (dir) {
            char *slash = strrchr(dir, '/');
            const char *dn = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
            int dfd = open(dn, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                if (fsync(dfd) && errno != EINVAL)
                    st = lpx_error(LPX_EIO, "safetensors %s: fsync of the directory: %s", path, strerror(errno));
                close(dfd);
            }
            lpx_free(dir);
        }
    }
    if (!st && bytes) *bytes = hash.n;
    if (!st && fnv) *fnv = hash_final(&hash);
fail:
    if (fd >= 0) close(fd);
    if (tmp) {
        unlink(tmp);
        lpx_free(tmp);
    }
    cJSON_free(hdr);
    cJSON_Delete(root);
    for (int i = 0; items && i < nitems; i++) lpx_tensor_release(items[i].t);
    for (int i = 0; owned && i < nowned; i++) lpx_free(owned[i]);
    lpx_free(items);
    lpx_free(owned);
    return st;
}
