/* Sharded checkpoints of the sharding engine (include/lpx/checkpoint.h,
 * docs/CHECKPOINT.md). Lives in interop (it writes safetensors and JSON)
 * and sees the engine through its public API only.
 *
 * Layout of a checkpoint directory:
 *   rank-RRRRR-of-WWWWW.safetensors   one per rank of the saving world:
 *       "<group>/<i>/<name>"          the local shard (dense or kind)
 *       "<group>/<i>/<name>#m", "#v"  AdamW's moments (f32, the shard's shape)
 *       __metadata__ "step:<key>"     AdamW's step count
 *       "extra/<name>"                the caller's extra tensors of that rank
 *   index.json                        written last: format, world, every
 *       file's bytes and FNV-1a 64, every parameter's global shape, dtype,
 *       kind, shard unit and frozen flag; every extra's name and rank; the
 *       caller's "user" object
 * Commit: all ranks write into "<dir>.tmp"; once every rank's file is
 * durable (a collective agreement), rank 0 writes the index there, moves
 * a previous "<dir>" aside, renames "<dir>.tmp" to "<dir>" and removes the
 * old one; a crash before the rename leaves the previous checkpoint, one
 * after it the new one (a leftover "<dir>.old" is removed by the next save). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fsdp_ckpt_internal.h"
#include "safetensors_internal.h"
#include "lpx/optim_state.h"

/* ---- small helpers ---------------------------------------------------- */

static void fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}


/* ---- save --------------------------------------------------------------- */

/* The CPU form of a tensor to write (retained, or copied to the host). */
static lpx_status on_host(lpx_tensor *t, lpx_tensor **out)
{
    if (lpx_tensor_device(t).type == LPX_DEVICE_CPU) {
        lpx_tensor_retain(t);
        *out = t;
        return LPX_OK;
    }
    return lpx_tensor_to(t, lpx_cpu(), out);
}

typedef struct ck_list {
    char **names;
    lpx_tensor **ts;
    int n, cap;
    lpx_safetensors_kv *meta;
    char **meta_store;
    int nmeta, mcap;
} ck_list;

static lpx_status list_add(ck_list *l, const char *name, lpx_tensor *t /* consumed */)
{
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 16;
        char **nn = lpx_realloc(l->names, (size_t)c * sizeof *nn);
        if (nn) l->names = nn;
        lpx_tensor **nt = nn ? lpx_realloc(l->ts, (size_t)c * sizeof *nt) : NULL;
        if (nt) l->ts = nt;
        if (!nn || !nt) {
            lpx_tensor_release(t);
            return lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory");
        }
        l->cap = c;
    }
    l->names[l->n] = lpx_strdup(name);
    if (!l->names[l->n]) {
        lpx_tensor_release(t);
        return lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory");
    }
    l->ts[l->n++] = t;
    return LPX_OK;
}

static lpx_status meta_add(ck_list *l, const char *key, const char *value)
{
    if (l->nmeta == l->mcap) {
        int c = l->mcap ? 2 * l->mcap : 16;
        lpx_safetensors_kv *nm = lpx_realloc(l->meta, (size_t)c * sizeof *nm);
        if (nm) l->meta = nm;
        char **ns = nm ? lpx_realloc(l->meta_store, (size_t)(2 * c) * sizeof *ns) : NULL;
        if (ns) l->meta_store = ns;
        if (!nm || !ns) return lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory");
        l->mcap = c;
    }
    char *k = lpx_strdup(key), *v = lpx_strdup(value);
    if (!k || !v) {
        lpx_free(k);
        lpx_free(v);
        return lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory");
    }
    l->meta_store[2 * l->nmeta] = k;
    l->meta_store[2 * l->nmeta + 1] = v;
    l->meta[l->nmeta].key = k;
    l->meta[l->nmeta].value = v;
    l->nmeta++;
    return LPX_OK;
}

static void list_free(ck_list *l)
{
    for (int i = 0; i < l->n; i++) {
        lpx_free(l->names[i]);
        lpx_tensor_release(l->ts[i]);
    }
    for (int i = 0; i < 2 * l->nmeta; i++) lpx_free(l->meta_store[i]);
    lpx_free(l->names);
    lpx_free(l->ts);
    lpx_free(l->meta);
    lpx_free(l->meta_store);
}

/* An extra tensor's name: 1-255 bytes, printable, no quote or backslash
 * (it is a safetensors key and a JSON string). */
static lpx_status check_extra_name(const char *op, const char *name)
{
    size_t n = name ? strlen(name) : 0;
    bool ok = n > 0 && n <= 255;
    for (size_t i = 0; ok && i < n; i++) ok = name[i] > 0x20 && name[i] < 0x7f && name[i] != '"' && name[i] != '\\';
    if (!ok)
        return lpx_error(LPX_EINVAL, "%s: extra tensor name '%s' (1-255 printable bytes, no space, quote or backslash)",
                         op, name ? name : "(NULL)");
    return LPX_OK;
}

/* This rank's file: every local shard, AdamW state, the caller's extras. */
static lpx_status write_rank(lpx_fsdp *f, const char *path, const lpx_fsdp_ckpt_opts *opts, ck_file *me)
{
    ck_list l;
    memset(&l, 0, sizeof l);
    lpx_status st = LPX_OK;
    char key[512], name[600], val[64];
    for (int gi = 0; gi < lpx_fsdp_group_count(f) && !st; gi++) {
        lpx_fsdp_group *g = lpx_fsdp_group_at(f, gi);
        for (int i = 0; i < lpx_fsdp_param_count(g) && !st; i++) {
            ck_key(g, i, key, sizeof key);
            /* a wrapper kind (a float8_weight) is saved as its dense master:
             * what it adds is per-step state the next cast recomputes, and
             * its metadata is process-local */
            lpx_tensor *h = NULL, *loc = lpx_fsdp_param_local(g, i);
            const lpx_kind *k = lpx_tensor_kind(loc);
            if (k && lpx_kind_vtable(k)->master) loc = lpx_kind_vtable(k)->master(loc);
            if ((st = on_host(loc, &h)) || (st = list_add(&l, key, h))) break;
            if (lpx_fsdp_param_flags(g, i) & LPX_FSDP_FROZEN) continue;
            /* a scaled-f16 master: the shard above is its codes, its block
             * scales go beside it ("<key>#w.scales"; the block in the index) */
            lpx_tensor *wsc = NULL;
            if ((st = lpx_fsdp_param_master_scale(g, i, &wsc))) break;
            if (wsc) {
                lpx_tensor *h2 = NULL;
                snprintf(name, sizeof name, "%s#w.scales", key);
                if (!(st = on_host(wsc, &h2))) st = list_add(&l, name, h2);
                lpx_tensor_release(wsc);
                if (st) break;
            }
            /* the engine's moments as they are (no copy: a save holds no
             * second copy of the state); none before the first step */
            lpx_tensor *m = NULL, *v = NULL;
            int64_t step = 0;
            lpx_fsdp_optim oc;
            if ((st = lpx_fsdp_group_get_optim(g, &oc))) break;
            if (oc.state != LPX_FSDP_STATE_F32) {
                /* low-precision moments: their codes and block scales as
                 * they are ("<key>#m.codes", "#m.scales", "#v.codes",
                 * "#v.scales"; the format and block are in the index) */
                if ((st = lpx_fsdp_param_optim_state(g, i, &m, &v, &step))) break;
                lpx_tensor *mv[2] = {m, v};
                static const char *const part[4] = {"#m.codes", "#m.scales", "#v.codes", "#v.scales"};
                for (int q = 0; q < 4 && !st && m && v; q++) {
                    lpx_tensor *h2 = NULL;
                    snprintf(name, sizeof name, "%s%s", key, part[q]);
                    if (!(st = on_host(lpx_tensor_inner(mv[q / 2], q % 2), &h2))) st = list_add(&l, name, h2);
                }
                lpx_tensor_release(m);
                lpx_tensor_release(v);
                if (st) break;
                snprintf(name, sizeof name, "step:%s", key);
                snprintf(val, sizeof val, "%" PRId64, step);
                st = meta_add(&l, name, val);
                continue;
            }
            if ((st = lpx_fsdp_param_adamw_view(g, i, &m, &v, &step))) break;
            if (m && v) {
                snprintf(name, sizeof name, "%s#m", key);
                if ((st = list_add(&l, name, m))) {
                    lpx_tensor_release(v);
                    break;
                }
                snprintf(name, sizeof name, "%s#v", key);
                if ((st = list_add(&l, name, v))) break;
            } else {
                lpx_tensor_release(m);
                lpx_tensor_release(v);
            }
            snprintf(name, sizeof name, "step:%s", key);
            snprintf(val, sizeof val, "%" PRId64, step);
            st = meta_add(&l, name, val);
        }
    }
    for (int i = 0; opts && i < opts->nextra && !st; i++) {
        lpx_tensor *h = NULL;
        if ((st = check_extra_name("lpx_fsdp_save", opts->extra_names[i]))) break;
        for (int j = 0; j < i && !st; j++)
            if (!strcmp(opts->extra_names[i], opts->extra_names[j]))
                st = lpx_error(LPX_EINVAL, "lpx_fsdp_save: extra tensor '%s' is given twice", opts->extra_names[i]);
        if (!st && !opts->extra[i]) st = lpx_error(LPX_EINVAL, "lpx_fsdp_save: extra tensor '%s' is NULL", opts->extra_names[i]);
        snprintf(name, sizeof name, CK_EXTRA "%s", opts->extra_names[i]);
        if (!st && !(st = on_host(opts->extra[i], &h))) st = list_add(&l, name, h);
    }
    /* size and checksum from the bytes as they are written (no read-back);
     * in place: <dir>.tmp is committed whole (its entries made durable by
     * the one directory fsync after the index), so no per-file temporary
     * file, rename or directory fsync */
    if (!st) st = lpx__st_save_hashed(path, l.n, (const char *const *)l.names, l.ts, l.nmeta, l.meta, true, &me->bytes,
                                      &me->fnv);
    list_free(&l);
    return st;
}

static cJSON *index_json(lpx_fsdp *f, int world, const ck_file *files, cJSON *user /* consumed */)
{
    cJSON *root = cJSON_CreateObject(), *fl = cJSON_CreateArray(), *ps = cJSON_CreateArray();
    if (!root || !fl || !ps) {
        cJSON_Delete(user);
        goto oom;
    }
    if (user) cJSON_AddItemToObject(root, "user", user);
    cJSON_AddItemToObject(root, "files", fl);
    cJSON_AddItemToObject(root, "params", ps);
    if (!cJSON_AddStringToObject(root, "format", CK_FORMAT) || !cJSON_AddNumberToObject(root, "version", CK_VERSION) ||
        !cJSON_AddNumberToObject(root, "world", world))
        goto oom_root;
    char name[128], hex[32];
    for (int r = 0; r < world; r++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) goto oom_root;
        cJSON_AddItemToArray(fl, o);
        ck_rank_file(name, sizeof name, "", r, world);
        snprintf(hex, sizeof hex, "%016" PRIx64, files[r].fnv);
        if (!cJSON_AddStringToObject(o, "name", name + 1) || !cJSON_AddNumberToObject(o, "bytes", (double)files[r].bytes) ||
            !cJSON_AddStringToObject(o, "fnv1a64", hex))
            goto oom_root;
    }
    char key[512];
    for (int gi = 0; gi < lpx_fsdp_group_count(f); gi++) {
        lpx_fsdp_group *g = lpx_fsdp_group_at(f, gi);
        for (int i = 0; i < lpx_fsdp_param_count(g); i++) {
            lpx_tensor *dt = lpx_fsdp_param_dtensor(g, i), *loc = lpx_fsdp_param_local(g, i);
            const lpx_kind *k = lpx_tensor_kind(loc);
            int64_t unit = 1;
            lpx_fsdp_param_rows(g, i, NULL, NULL, &unit);
            ck_key(g, i, key, sizeof key);
            cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
            if (!o || !sh) {
                cJSON_Delete(o);
                cJSON_Delete(sh);
                goto oom_root;
            }
            cJSON_AddItemToArray(ps, o);
            cJSON_AddItemToObject(o, "shape", sh);
            for (int d = 0; d < lpx_tensor_ndim(dt); d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)lpx_tensor_shape(dt)[d]));
            if (!cJSON_AddStringToObject(o, "key", key) ||
                !cJSON_AddStringToObject(o, "dtype", lpx_dtype_name(lpx_tensor_dtype(dt))) ||
                !cJSON_AddStringToObject(o, "kind", k ? lpx_kind_name(k) : "") ||
                !cJSON_AddNumberToObject(o, "unit", (double)unit) ||
                !cJSON_AddNumberToObject(o, "frozen", (lpx_fsdp_param_flags(g, i) & LPX_FSDP_FROZEN) ? 1 : 0))
                goto oom_root;
            /* low-precision moments: their format and block (absent: f32) */
            lpx_fsdp_optim oc;
            if (!lpx_fsdp_group_get_optim(g, &oc) && oc.state != LPX_FSDP_STATE_F32 &&
                (!cJSON_AddNumberToObject(o, "optim_state", (double)oc.state) ||
                 !cJSON_AddNumberToObject(o, "optim_block", (double)oc.block)))
                goto oom_root;
            /* a scaled-f16 master: its block (absent: the shard is the master) */
            lpx_tensor *wsc = NULL;
            if (!lpx_fsdp_param_master_scale(g, i, &wsc) && wsc) {
                lpx_tensor_release(wsc);
                if (!cJSON_AddNumberToObject(o, "master_block", (double)oc.block)) goto oom_root;
            }
        }
    }
    return root;
oom:
    cJSON_Delete(fl);
    cJSON_Delete(ps);
oom_root:
    cJSON_Delete(root);
    lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory for the index");
    return NULL;
}

static lpx_status write_index(const char *dir, cJSON *index)
{
    char tmp[CK_PATH], path[CK_PATH];
    if (snprintf(tmp, sizeof tmp, "%s/index.json.tmp", dir) >= (int)sizeof tmp ||
        snprintf(path, sizeof path, "%s/index.json", dir) >= (int)sizeof path)
        return lpx_error(LPX_EINVAL, "lpx_fsdp_save: dir path is too long");
    /* the index covers itself: "checksum" holds the FNV-1a 64 of the
     * whole text with that field's 16 digits written as zeros */
    cJSON_DeleteItemFromObjectCaseSensitive(index, "checksum");
    if (!cJSON_AddStringToObject(index, "checksum", "0000000000000000"))
        return lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory for the index");
    char *text = cJSON_Print(index);
    if (!text) return lpx_error(LPX_ENOMEM, "lpx_fsdp_save: out of memory for the index");
    char *digits = ck_sum_digits(text);
    if (!digits) {
        free(text);
        return lpx_error(LPX_EINTERNAL, "lpx_fsdp_save: the index's checksum field is not where it is expected");
    }
    char hx[17];
    snprintf(hx, sizeof hx, "%016" PRIx64, ck_fnv_text(text, strlen(text)));
    memcpy(digits, hx, 16);
    lpx_status st = LPX_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t n = strlen(text);
    if (fd < 0) st = lpx_error(LPX_EIO, "checkpoint %s: open: %s", tmp, strerror(errno));
    else if (write(fd, text, n) != (ssize_t)n) st = lpx_error(LPX_EIO, "checkpoint %s: write: %s", tmp, strerror(errno));
    else if (fsync(fd)) st = lpx_error(LPX_EIO, "checkpoint %s: fsync: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (!st && rename(tmp, path)) st = lpx_error(LPX_EIO, "checkpoint %s: rename: %s", path, strerror(errno));
    if (!st) fsync_dir(dir);
    free(text);
    return st;
}

/* Rank 0's commit: <dir>.tmp becomes <dir>, the previous one removed.
 * With a previous checkpoint the two directories are exchanged in one
 * atomic step (renameat2 RENAME_EXCHANGE), so <dir> always names a
 * complete checkpoint; where the file system cannot exchange, the old one
 * is moved to <dir>.old first and lpx_fsdp_load falls back to it if a
 * crash came between the two renames. The previous checkpoint is locked
 * exclusively first: readers (lpx_fsdp_load, an open lpx_fsdp_ckpt) hold
 * it shared, so none of them sees its files go, and none reads half of
 * one checkpoint and half of the next. Only names a save writes are
 * removed (ck_check_target accepted the directory before the save). */
static lpx_status commit(const char *op, const char *dir, const char *tmp)
{
    char old[CK_PATH], parent[CK_PATH];
    if (snprintf(old, sizeof old, "%s.old", dir) >= (int)sizeof old)
        return lpx_error(LPX_EINVAL, "%s: dir path is too long", op);
    lpx_status st = ck_remove_own_dir(op, old);
    if (st) return st;
    ck_parent_of(dir, parent, sizeof parent);
    int prev = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (prev < 0) {
        if (errno != ENOENT) return lpx_error(LPX_EIO, "checkpoint %s: open: %s", dir, strerror(errno));
        if (rename(tmp, dir)) return lpx_error(LPX_EIO, "checkpoint %s: rename to %s: %s", tmp, dir, strerror(errno));
        fsync_dir(parent);
        return LPX_OK;
    }
    if (ck_flock_wait(prev, LOCK_EX, CK_SAVE_WAIT_MS) == 0) {
        close(prev);
        return lpx_error(LPX_EIO, "%s: '%s' has been open for reading (lpx_fsdp_load, or an lpx_fsdp_ckpt handle not "
                         "closed) for %d s; the new checkpoint is complete in '%s', the old one untouched", op, dir,
                         CK_SAVE_WAIT_MS / 1000, tmp);
    }
    struct stat a, b;
    if (fstat(prev, &a) || lstat(dir, &b) || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(prev);
        return lpx_error(LPX_EIO, "%s: '%s' was replaced by someone else during the save; the new checkpoint is "
                         "complete in '%s'", op, dir, tmp);
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        fsync_dir(parent);
        st = ck_remove_own_dir(op, tmp); /* the previous checkpoint, now at <dir>.tmp */
    } else if (errno != EINVAL && errno != ENOSYS) {
        st = lpx_error(LPX_EIO, "checkpoint %s: renameat2 (exchange with %s): %s", dir, tmp, strerror(errno));
    } else if (rename(dir, old)) {
        st = lpx_error(LPX_EIO, "checkpoint %s: rename to %s: %s", dir, old, strerror(errno));
    } else if (rename(tmp, dir)) {
        st = lpx_error(LPX_EIO, "checkpoint %s: rename to %s: %s", tmp, dir, strerror(errno));
    } else {
        fsync_dir(parent);
        st = ck_remove_own_dir(op, old);
    }
    close(prev);   /* the lock goes with it */
    return st;
}

/* Rank 0, before any rank writes: dir may be replaced (ck_check_target),
 * and <dir>.tmp made fresh and locked (an earlier save's leftover is
 * removed, unless a save still running holds it); *lock: the open tmp */
static lpx_status prepare_tmp(const char *op, const char *dir, const char *tmp, int *lock)
{
    *lock = -1;
    lpx_status st = ck_check_target(op, dir);
    if (st) return st;
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        int got = ck_flock_wait(fd, LOCK_EX, 0);
        if (got == 0) {
            close(fd);
            return lpx_error(LPX_EIO, "%s: another save into '%s' is in progress ('%s' is locked); nothing was "
                             "changed", op, dir, tmp);
        }
        st = ck_remove_own_dir(op, tmp);
        close(fd);
        if (st) return st;
    }
    if (mkdir(tmp, 0755)) return lpx_error(LPX_EIO, "checkpoint %s: mkdir: %s", tmp, strerror(errno));
    fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || ck_flock_wait(fd, LOCK_EX, 0) == 0) {
        if (fd >= 0) close(fd);
        return lpx_error(LPX_EIO, "%s: another save into '%s' started at the same time; nothing was changed", op, dir);
    }
    *lock = fd;
    return LPX_OK;
}

lpx_status lpx_fsdp_save_check(const char *dir)
{
    const char *op = "lpx_fsdp_save_check";
    char norm[CK_PATH - 64];
    lpx_status st = lpx_ensure_init();
    if (st || (st = ck_norm_dir(op, dir, norm, sizeof norm))) return st;
    return ck_check_target(op, norm);
}

typedef struct ck_extra_at {
    const char *name;
    int rank;
} ck_extra_at;

static int extra_cmp(const void *a, const void *b)
{
    return strcmp(((const ck_extra_at *)a)->name, ((const ck_extra_at *)b)->name);
}

/* Rank 0: the index's "extras" ([[name, rank], ...]) from the headers of
 * the ranks' files (only those that hold some); a name two ranks used is
 * refused naming both. */
static lpx_status index_extras(const char *op, cJSON *index, const char *tmp, int world, const uint64_t *nextra)
{
    uint64_t total = 0;
    for (int r = 0; r < world; r++) total += nextra[r];
    if (!total) return LPX_OK;
    lpx_status st = LPX_OK;
    lpx_safetensors **sf = lpx_calloc((size_t)world, sizeof *sf);
    ck_extra_at *at = lpx_calloc((size_t)total, sizeof *at);
    cJSON *arr = cJSON_CreateArray();
    size_t n = 0, pre = strlen(CK_EXTRA);
    char path[CK_PATH];
    if (!sf || !at || !arr) st = lpx_error(LPX_ENOMEM, "%s: out of memory for the index", op);
    for (int r = 0; r < world && !st; r++) {
        if (!nextra[r]) continue;
        ck_rank_file(path, sizeof path, tmp, r, world);
        if ((st = lpx_safetensors_open(path, &sf[r]))) break;
        for (int i = 0; i < lpx_safetensors_count(sf[r]) && n < total; i++) {
            const char *nm = lpx_safetensors_name(sf[r], i);
            if (!strncmp(nm, CK_EXTRA, pre)) at[n++] = (ck_extra_at){nm + pre, r};
        }
    }
    if (!st) qsort(at, n, sizeof *at, extra_cmp);
    for (size_t i = 0; i < n && !st; i++) {
        if (i && !strcmp(at[i].name, at[i - 1].name)) {
            st = lpx_error(LPX_EINVAL, "%s: extra tensor '%s' is given by ranks %d and %d (names are global)", op,
                           at[i].name, at[i - 1].rank < at[i].rank ? at[i - 1].rank : at[i].rank,
                           at[i - 1].rank < at[i].rank ? at[i].rank : at[i - 1].rank);
            break;
        }
        cJSON *e = cJSON_CreateArray(), *nm = cJSON_CreateString(at[i].name), *rk = cJSON_CreateNumber(at[i].rank);
        if (e) cJSON_AddItemToArray(arr, e);
        if (nm && e) cJSON_AddItemToArray(e, nm);
        else cJSON_Delete(nm);
        if (rk && e) cJSON_AddItemToArray(e, rk);
        else cJSON_Delete(rk);
        if (!e || !nm || !rk) st = lpx_error(LPX_ENOMEM, "%s: out of memory for the index", op);
    }
    if (!st) {
        cJSON_AddItemToObject(index, "extras", arr);
        arr = NULL;
    }
    cJSON_Delete(arr);
    for (int r = 0; sf && r < world; r++) lpx_safetensors_close(sf[r]);
    lpx_free(sf);
    lpx_free(at);
    return st;
}

/* Rank 0's user object, parsed (NULL: none). */
static lpx_status parse_user(const char *op, const lpx_fsdp_ckpt_opts *opts, cJSON **out)
{
    *out = NULL;
    if (!opts || !opts->user_json) return LPX_OK;
    if (strlen(opts->user_json) > ((size_t)64 << 20))
        return lpx_error(LPX_EINVAL, "%s: opts->user_json is over 64 MiB", op);
    cJSON *u = cJSON_Parse(opts->user_json);
    if (!u || !cJSON_IsObject(u)) {
        cJSON_Delete(u);
        return lpx_error(LPX_EINVAL, "%s: opts->user_json is not the text of a JSON object", op);
    }
    *out = u;
    return LPX_OK;
}

lpx_status lpx_fsdp_save(lpx_fsdp *f, const char *dir) { return lpx_fsdp_save_ex(f, dir, NULL); }

lpx_status lpx_fsdp_save_ex(lpx_fsdp *f, const char *dir, const lpx_fsdp_ckpt_opts *opts)
{
    const char *op = "lpx_fsdp_save";
    ck_mesh cm;
    lpx_status st = lpx_ensure_init();
    if (st || (st = ck_check_engine(op, f, &cm))) return st;
    char norm[CK_PATH - 64];
    if ((st = ck_norm_dir(op, dir, norm, sizeof norm))) return st;
    dir = norm;   /* "ck/" is "ck": its temporary is "ck.tmp", not "ck/.tmp" */
    if (opts && opts->struct_size && opts->struct_size < offsetof(lpx_fsdp_ckpt_opts, flags) + sizeof(unsigned))
        return lpx_error(LPX_EINVAL, "%s: opts->struct_size %zu is smaller than this version's", op, opts->struct_size);
    if (opts && opts->nextra && (opts->nextra < 0 || !opts->extra_names || !opts->extra))
        return lpx_error(LPX_EINVAL, "%s: opts->nextra is %d with %s", op, opts->nextra,
                         opts->nextra < 0 ? "a negative count" : "NULL names or tensors");
    /* replica 0 of a 2-D mesh writes (the replicas hold the same shards);
     * its shard rank 0 leads */
    int rank = cm.rank, world = cm.world;
    bool writer = cm.replica_rank == 0, lead = writer && rank == 0;
    lpx_comm *comm = cm.shard;
    char tmp[CK_PATH], path[CK_PATH];
    cJSON *user = NULL;
    /* the directory by its folder's real path, resolved once by the lead
     * and handed to every rank: a link in the path switched during the
     * save (a "latest" link repointed) cannot split its steps between
     * two folders */
    char real[CK_PATH - 64] = "";
    if (lead) {
        char parent[CK_PATH], rp[PATH_MAX];
        ck_parent_of(dir, parent, sizeof parent);
        const char *base = strrchr(dir, '/');
        base = base ? base + 1 : dir;
        if (realpath(parent, rp) &&
            snprintf(real, sizeof real, "%s%s%s", rp, strcmp(rp, "/") ? "/" : "", base) >= (int)sizeof real)
            real[0] = 0;   /* too long: the name as given */
    }
    if ((st = lpx_comm_broadcast_buf(comm, real, sizeof real, 0))) return st;
    if (real[0]) dir = real;
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    /* 1: rank 0 checks its user object and makes a fresh <dir>.tmp (and
     * every rank has its buffer for step 3: no allocation between
     * collectives) */
    ck_file *files = lpx_calloc((size_t)world, sizeof *files);
    uint64_t *nextra = lpx_calloc((size_t)world, sizeof *nextra);
    lpx_status mine = files && nextra ? LPX_OK : lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    int lock = -1;   /* rank 0: <dir>.tmp, locked until the commit ends */
    if (lead && !mine && !(mine = parse_user(op, opts, &user))) mine = prepare_tmp(op, dir, tmp, &lock);
    if ((st = ck_agree_all(&cm, op, mine))) goto out;
    /* 2: every rank writes its file (durable: safetensors fsyncs), and
     * measures it for the index */
    ck_file me = {0, 0};
    uint64_t my_extra = opts ? (uint64_t)opts->nextra : 0;
    ck_rank_file(path, sizeof path, tmp, rank, world);
    if (writer) mine = write_rank(f, path, opts, &me);
    else if (my_extra)
        mine = lpx_error(LPX_EINVAL, "%s: replica %d of the 2-D mesh gives extra tensors; only replica 0's ranks "
                         "save them (the replicas hold the same shards)", op, cm.replica_rank);
    if ((st = ck_agree_all(&cm, op, mine))) goto out;
    /* 3: rank 0 writes the index from every rank's file record, then commits */
    if ((st = lpx_comm_all_gather_buf(comm, &me, files, sizeof me)) ||
        (st = lpx_comm_all_gather_buf(comm, &my_extra, nextra, sizeof my_extra)))
        goto out;
    mine = LPX_OK;
    if (lead) {
        cJSON *index = index_json(f, world, files, user);
        user = NULL;
        mine = index ? index_extras(op, index, tmp, world, nextra) : LPX_ENOMEM;
        if (!mine) mine = write_index(tmp, index);
        cJSON_Delete(index);
        if (!mine) mine = commit(op, dir, tmp);
    }
    st = ck_agree_all(&cm, op, mine);
out:
    if (lock >= 0) close(lock);
    cJSON_Delete(user);
    lpx_free(files);
    lpx_free(nextra);
    return st;
}

/* ---- load --------------------------------------------------------------- */

static const cJSON *find_param(const ck_index *ix, const char *key)
{
    const cJSON *p;
    cJSON_ArrayForEach(p, ix->params)
    {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(p, "key");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, key)) return p;
    }
    return NULL;
}

/* A dense parameter or a wrapper kind (one with a dense master): the rows
 * of either load into the other. */
static bool master_form(const char *kind_name)
{
    if (!kind_name[0]) return true;
    const lpx_kind *k = NULL;
    if (lpx_kind_find(kind_name, &k) != LPX_OK) {
        lpx_clear_error();
        return false;
    }
    return lpx_kind_vtable(k)->master != NULL;
}

/* The saved entry agrees with the engine's parameter: shape and dtype;
 * the same kind and shard unit, or both in master form (dense or a
 * wrapper, whose rows move at any unit). *saved_unit: the unit the saved
 * shards were cut at. */
static lpx_status check_param(const char *op, const cJSON *p, const char *key, lpx_tensor *dt, lpx_tensor *loc,
                              int64_t unit, int64_t *saved_unit)
{
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(p, "dtype");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(p, "kind");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(p, "shape");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(p, "unit");
    const lpx_kind *k = lpx_tensor_kind(loc);
    const char *mine = k ? lpx_kind_name(k) : "";
    bool ok = cJSON_IsString(dtype) && !strcmp(dtype->valuestring, lpx_dtype_name(lpx_tensor_dtype(dt))) &&
              cJSON_IsString(kind) && cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == lpx_tensor_ndim(dt) &&
              cJSON_IsNumber(u) && u->valuedouble >= 1 && u->valuedouble <= 9e15 &&
              u->valuedouble == (double)(int64_t)u->valuedouble;
    if (ok) {
        bool same = !strcmp(kind->valuestring, mine) && u->valuedouble == (double)unit;
        ok = same || (master_form(kind->valuestring) && master_form(mine));
    }
    for (int d = 0; ok && d < lpx_tensor_ndim(dt); d++) {
        const cJSON *s = cJSON_GetArrayItem(shape, d);
        ok = cJSON_IsNumber(s) && s->valuedouble == (double)lpx_tensor_shape(dt)[d];
    }
    if (!ok) {
        char sh[160];
        return lpx_error(LPX_EINVAL, "%s: parameter '%s' was saved with another shape, dtype, kind or shard unit "
                         "(the engine has %s %s %s, unit %lld; the checkpoint %s): an incompatible model", op, key,
                         lpx_tensor_shape_str(dt, sh, sizeof sh), lpx_dtype_name(lpx_tensor_dtype(dt)),
                         k ? lpx_kind_name(k) : "dense", (long long)unit,
                         cJSON_IsString(kind) ? (kind->valuestring[0] ? kind->valuestring : "dense") : "no kind");
    }
    *saved_unit = (int64_t)u->valuedouble;
    return LPX_OK;
}

/* The rows [a, a + n) of the saved tensor `name` of old rank r, whose
 * shard starts at row r0 (a view of the mapping where the file allows). */
static lpx_status old_rows(const char *op, ck_open *o, int r, const char *name, int64_t rel, int64_t n,
                           lpx_tensor **out)
{
    lpx_safetensors *sf = NULL;
    lpx_tensor *t = NULL;
    lpx_status st = ck_open_rank(op, o, r, &sf);
    if (!st && (st = lpx_safetensors_get(sf, name, &t)))
        st = lpx_error(st, "%s: rank %d's file lacks '%s'", op, r, name);
    if (!st && rel == 0 && n == lpx_tensor_shape(t)[0]) {
        *out = t;   /* the whole saved shard, as saved */
        return LPX_OK;
    }
    if (!st) st = lpx_narrow(t, 0, rel, n, out);
    lpx_tensor_release(t);
    return st;
}

/* dst (the engine's local shard of a kind without a dense master, refilled
 * inner tensor by inner tensor) takes src's metadata: the saved tensor's
 * (an NF4 scaler mean, say), not the one the model was built with. A kind
 * whose metadata owns memory (meta_release) cannot be rewritten in place:
 * refused unless the two are already equal. */
static lpx_status adopt_meta(const char *op, const char *key, lpx_tensor *dst, const lpx_tensor *src)
{
    size_t nd = 0, ns = 0;
    const void *md = lpx_tensor_meta(dst, &nd), *ms = lpx_tensor_meta(src, &ns);
    if (nd == ns && (!ns || !memcmp(md, ms, ns))) return LPX_OK;
    const lpx_kind *k = lpx_tensor_kind(dst);
    if (lpx_kind_vtable(k)->meta_release || ns > LPX_MAX_META)
        return lpx_error(LPX_ENOTIMPL, "%s: parameter '%s' (%s): the saved metadata differs from the model's and the "
                         "kind's metadata owns memory (it cannot be rewritten in place)", op, key, lpx_kind_name(k));
    memcpy(dst->meta, ms, ns);
    dst->meta_size = (uint32_t)ns;
    return LPX_OK;
}

/* Copies piece (rows [at, at + n) of this rank's shard) into dst (the
 * local shard or an AdamW moment of its shape). */
static lpx_status put_rows(const char *op, const char *key, lpx_tensor *dst, int64_t at, int64_t n, int64_t len,
                           lpx_tensor *piece)
{
    lpx_tensor *d = dst, *view = NULL, *src = piece;
    const lpx_kind *k = lpx_tensor_kind(dst);
    if (k) {
        const lpx_kind_i *vt = lpx_kind_vtable(k);
        if (vt->master) {
            d = vt->master(dst);
        } else if (at == 0 && n == len) {
            /* a kind with no dense master: whole shards only, inner tensor by inner tensor */
            int ni = lpx_tensor_inner_count(dst);
            if (ni != lpx_tensor_inner_count(piece))
                return lpx_error(LPX_EINVAL, "%s: parameter '%s' (%s): the saved shard has %d inner tensors, the "
                                 "model's %d", op, key, lpx_kind_name(k), lpx_tensor_inner_count(piece), ni);
            for (int i = 0; i < ni; i++) {
                lpx_status st = lpx_copy_(lpx_tensor_inner(dst, i), lpx_tensor_inner(piece, i));
                if (st) return st;
            }
            return adopt_meta(op, key, dst, piece);
        } else {
            return lpx_error(LPX_ENOTIMPL, "%s: parameter '%s' is a %s tensor whose shards changed with the world "
                             "size; re-cutting kind tensors without a dense master is not done yet (load it at the "
                             "saving world size)", op, key, lpx_kind_name(k));
        }
    }
    /* a wrapper kind's saved piece: its master's rows (it may load into a
     * dense parameter, or a dense piece into a wrapper's master) */
    const lpx_kind *pk = lpx_tensor_kind(piece);
    if (pk) {
        const lpx_kind_i *pvt = lpx_kind_vtable(pk);
        if (!pvt->master)
            return lpx_error(LPX_EINVAL, "%s: parameter '%s': the saved %s shard has no dense master", op, key,
                             lpx_kind_name(pk));
        src = pvt->master(piece);
    }
    lpx_status st = lpx_narrow(d, 0, at, n, &view);
    if (!st) st = lpx_copy_(view, src);
    lpx_tensor_release(view);
    return st;
}

/* A kind tensor without a dense master whose new shard is not exactly one
 * saved shard: its pieces (whole shard units of saved shards, in row
 * order) go through the kind's own all-gather hooks, as the engine's
 * unshard would assemble them (pre_all_gather on each piece, the inputs
 * concatenated along dim 0, post_all_gather), into the local shard in
 * place, or copied inner tensor by inner tensor. */
static lpx_status recut_kind(const char *op, const char *key, lpx_tensor *loc, lpx_tensor **pieces, int n)
{
    const lpx_kind *k = lpx_tensor_kind(loc);
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    if (!vt->pre_all_gather || !vt->post_all_gather)
        return lpx_error(LPX_ENOTIMPL, "%s: parameter '%s' (%s): its shards changed and the kind has no all-gather "
                         "hooks to re-cut it (load it at the saving world size)", op, key, lpx_kind_name(k));
    lpx_tensor **in = lpx_calloc((size_t)n * LPX_MAX_AG_INPUTS, sizeof *in), *outs[LPX_MAX_AG_INPUTS] = {0};
    lpx_tensor **col = lpx_calloc((size_t)n, sizeof *col), *res = NULL;
    unsigned char meta[LPX_MAX_META], other[LPX_MAX_META];
    size_t msz = 0, osz = 0;
    int nin = 0;
    lpx_status st = in && col ? LPX_OK : lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    for (int j = 0; j < n && !st; j++) {
        int nj = 0;
        st = vt->pre_all_gather(pieces[j], NULL, in + (size_t)j * LPX_MAX_AG_INPUTS, &nj, j ? other : meta,
                                j ? &osz : &msz);
        if (!st && j && nj != nin)
            st = lpx_error(LPX_EINVAL, "%s: parameter '%s': saved shards give %d and %d all-gather inputs", op, key,
                           nin, nj);
        if (!j) nin = nj;
    }
    for (int i = 0; i < nin && !st; i++) {
        for (int j = 0; j < n; j++) col[j] = in[(size_t)j * LPX_MAX_AG_INPUTS + i];
        st = lpx_cat(col, n, 0, &outs[i]);
    }
    if (!st) {
        st = vt->post_all_gather(k, outs, nin, meta, msz, lpx_tensor_dtype(loc), loc, &res);
        if (st) {
            /* the kind would not refill this tensor in place: build the
             * union, then copy its inner tensors over the local ones */
            lpx_clear_error();
            st = vt->post_all_gather(k, outs, nin, meta, msz, lpx_tensor_dtype(loc), NULL, &res);
            int ni = st ? 0 : lpx_tensor_inner_count(loc);
            if (!st && ni != lpx_tensor_inner_count(res))
                st = lpx_error(LPX_EINVAL, "%s: parameter '%s': the re-cut shard has another layout", op, key);
            for (int q = 0; q < ni && !st; q++) {
                lpx_tensor *a = lpx_tensor_inner(loc, q), *b = lpx_tensor_inner(res, q);
                if (lpx_tensor_numel(a) != lpx_tensor_numel(b))
                    st = lpx_error(LPX_ENOTIMPL, "%s: parameter '%s' (%s): the re-cut shard's inner tensor %d has %lld "
                                   "elements, the local one %lld", op, key, lpx_kind_name(k), q,
                                   (long long)lpx_tensor_numel(b), (long long)lpx_tensor_numel(a));
                else
                    st = lpx_copy_(a, b);
            }
        }
    }
    if (!st && res && res != loc) st = adopt_meta(op, key, loc, res);
    for (size_t j = 0; in && j < (size_t)n * LPX_MAX_AG_INPUTS; j++) lpx_tensor_release(in[j]);
    for (int i = 0; i < LPX_MAX_AG_INPUTS; i++) lpx_tensor_release(outs[i]);
    lpx_tensor_release(res);
    lpx_free(in);
    lpx_free(col);
    return st;
}

/* ---- low-precision moments (issue 37) ------------------------------------ */

/* codes of the first e elements of a state (4-bit: two per byte, per block) */
static int64_t codes_at(int fmt, int64_t e, int64_t block)
{
    return fmt == LPX_OPTIM_STATE_4BIT ? e / block * (block / 2) + (e % block + 1) / 2 : e;
}
static int64_t blocks_at(int64_t e, int64_t block) { return e / block + (e % block != 0); }

/* a saved inner tensor of old rank r's state, flat */
static lpx_status saved_part(const char *op, ck_open *o, int r, const char *key, const char *part, lpx_tensor **out)
{
    char name[600];
    lpx_safetensors *sf = NULL;
    lpx_tensor *t = NULL;
    int64_t all = -1;
    snprintf(name, sizeof name, "%s%s", key, part);
    lpx_status st = ck_open_rank(op, o, r, &sf);
    if (!st && (st = lpx_safetensors_get(sf, name, &t))) st = lpx_error(st, "%s: rank %d's file lacks '%s'", op, r, name);
    if (!st) st = lpx_reshape(t, 1, &all, out);
    lpx_tensor_release(t);
    return st;
}

/* n elements of old rank r's saved state from its element `from` into the
 * new states qs (m, v) at element `to`: whole blocks (from and to are
 * block multiples), codes and scales copied as they are */
static lpx_status state_blocks(const char *op, ck_open *o, int r, const char *key, int fmt, int64_t block, int64_t from,
                               int64_t to, int64_t n, lpx_tensor *const *qs)
{
    static const char *const part[4] = {"#m.codes", "#m.scales", "#v.codes", "#v.scales"};
    if (from % block || to % block)
        return lpx_error(LPX_EINVAL, "%s: parameter '%s': a saved shard piece at element %lld moves to %lld, not on a "
                         "block of %lld", op, key, (long long)from, (long long)to, (long long)block);
    lpx_status st = LPX_OK;
    for (int q = 0; q < 4 && !st; q++) {
        bool sc = q % 2;
        int64_t f0 = sc ? from / block : codes_at(fmt, from, block);
        int64_t cnt = sc ? blocks_at(from + n, block) - from / block : codes_at(fmt, from + n, block) - f0;
        int64_t t0 = sc ? to / block : codes_at(fmt, to, block);
        lpx_tensor *src = NULL, *a = NULL, *b = NULL;
        if (!(st = saved_part(op, o, r, key, part[q], &src)) && !(st = lpx_narrow(src, 0, f0, cnt, &a)) &&
            !(st = lpx_narrow(lpx_tensor_inner(qs[q / 2], q % 2), 0, t0, cnt, &b)))
            st = lpx_copy_(b, a);
        if (st) st = lpx_error(st, "%s: parameter '%s': state %s of rank %d: %s", op, key, part[q], r, lpx_last_error());
        lpx_tensor_release(src);
        lpx_tensor_release(a);
        lpx_tensor_release(b);
    }
    return st;
}

/* the same piece dequantized into f32 moments m, v (another format or
 * block, or f32 moments in the engine): old rank r's whole saved state of
 * `numel` elements is rebuilt as a state tensor and dequantized */
static lpx_status state_f32(const char *op, ck_open *o, int r, const char *key, int fmt, int64_t block, int64_t numel,
                            int64_t from, int64_t to, int64_t n, lpx_tensor *m, lpx_tensor *v)
{
    static const char *const part[4] = {"#m.codes", "#m.scales", "#v.codes", "#v.scales"};
    lpx_tensor *dst[2] = {m, v};
    lpx_status st = LPX_OK;
    for (int j = 0; j < 2 && !st; j++) {
        lpx_tensor *in[2] = {NULL, NULL}, *t = NULL, *d = NULL, *flat = NULL, *src = NULL, *dv = NULL;
        lpx_optim_state_meta meta = {LPX_OPTIM_STATE_META_MAGIC, LPX_OPTIM_STATE_META_VERSION, fmt, j, block};
        int64_t all = -1;
        const lpx_kind *k = lpx_optim_state_kind((lpx_optim_state_format)fmt);
        if (!k) st = lpx_error(LPX_EINVAL, "%s: parameter '%s': optimizer-state format %d is not registered", op, key, fmt);
        if (!st) st = saved_part(op, o, r, key, part[2 * j], &in[0]);
        if (!st) st = saved_part(op, o, r, key, part[2 * j + 1], &in[1]);
        if (!st) st = lpx_kind_unflatten(k, LPX_F32, 1, &numel, in, 2, &meta, sizeof meta, &t);
        if (!st) st = lpx_kind_to_dense(t, &d);
        if (!st) st = lpx_reshape(d, 1, &all, &flat);
        if (!st) st = lpx_narrow(flat, 0, from, n, &src);
        if (!st) st = lpx_narrow(dst[j], 0, to, n, &dv);
        if (!st) st = lpx_copy_(dv, src);
        if (st) st = lpx_error(st, "%s: parameter '%s': dequantizing rank %d's saved state: %s", op, key, r, lpx_last_error());
        lpx_tensor *tmp[7] = {in[0], in[1], t, d, flat, src, dv};
        for (int q = 0; q < 7; q++) lpx_tensor_release(tmp[q]);
    }
    return st;
}

static lpx_status load_param(const char *op, ck_open *o, lpx_fsdp_group *g, int i, const cJSON *p, const char *key,
                             int64_t unit /* the saved shards' */)
{
    lpx_tensor *loc = lpx_fsdp_param_local(g, i);
    int64_t start = 0, len = 0, rows = lpx_tensor_shape(lpx_fsdp_param_dtensor(g, i))[0];
    lpx_status st = lpx_fsdp_param_rows(g, i, &start, &len, NULL);
    if (st) return st;
    bool frozen = lpx_fsdp_param_flags(g, i) & LPX_FSDP_FROZEN;
    const cJSON *fz = cJSON_GetObjectItemCaseSensitive(p, "frozen");
    bool saved_state = cJSON_IsNumber(fz) && fz->valuedouble == 0;
    lpx_tensor *m = NULL, *v = NULL;
    int64_t step = -1;
    char name[600];
    bool state = !frozen && saved_state;
    /* the step is the same on every saving rank: rank 0's file has it (a
     * rank with no rows now still takes it); at step 0 nothing else was
     * saved (no moments before the first step) */
    if (state) {
        lpx_safetensors *sf = NULL;
        snprintf(name, sizeof name, "step:%s", key);
        if ((st = ck_open_rank(op, o, 0, &sf))) return st;
        const char *sv = lpx_safetensors_metadata(sf, name);
        char *end = NULL;
        long long n = sv ? strtoll(sv, &end, 10) : -1;
        if (!sv || *end || n < 0)
            return lpx_error(LPX_EINVAL, "%s: parameter '%s': rank 0's file has %s AdamW step", op, key,
                             sv ? "a malformed" : "no");
        step = n;
    }
    /* low-precision moments: the saved format and block (index) and the
     * engine's; the same on both sides: blocks are copied whole (both
     * shardings start every shard on a block of the global flat index);
     * otherwise through f32 (dequantized, and requantized by the engine) */
    const cJSON *jsf = cJSON_GetObjectItemCaseSensitive(p, "optim_state");
    const cJSON *jsb = cJSON_GetObjectItemCaseSensitive(p, "optim_block");
    int sfmt = cJSON_IsNumber(jsf) ? (int)jsf->valuedouble : 0;
    int64_t sblock = cJSON_IsNumber(jsb) ? (int64_t)jsb->valuedouble : 0;
    if (sfmt < 0 || sfmt > 3 || (sfmt && (sblock < 2 || sblock > LPX_OPTIM_STATE_BLOCK_MAX || (sblock & (sblock - 1)))))
        return lpx_error(LPX_EINVAL, "%s: parameter '%s': optim_state %d / optim_block %lld in the index out of range", op,
                         key, sfmt, (long long)sblock);
    lpx_fsdp_optim oc;
    if ((st = lpx_fsdp_group_get_optim(g, &oc))) return st;
    bool whole = sfmt && sfmt == (int)oc.state && sblock == oc.block;
    /* a scaled-f16 master (f16 codes in the shard, "#w.scales" beside it):
     * only into the same master and block; its blocks move whole */
    const cJSON *jmb = cJSON_GetObjectItemCaseSensitive(p, "master_block");
    int64_t mblock = cJSON_IsNumber(jmb) ? (int64_t)jmb->valuedouble : 0;
    lpx_tensor *wsc = NULL, *wnew = NULL;
    if (!frozen && (st = lpx_fsdp_param_master_scale(g, i, &wsc))) return st;
    if (!frozen && (mblock != 0) != (wsc != NULL))
        st = lpx_error(LPX_EINVAL, "%s: parameter '%s': saved with %s master, loading into %s: not supported (resume "
                       "with the same --master)", op, key, mblock ? "a scaled-f16" : "a plain", wsc ? "a scaled-f16 one"
                                                                                            : "a plain one");
    else if (wsc && mblock != oc.block)
        st = lpx_error(LPX_EINVAL, "%s: parameter '%s': the scaled-f16 master was saved in blocks of %lld, the engine's "
                       "are %lld", op, key, (long long)mblock, (long long)oc.block);
    else if (wsc)
        st = lpx_clone(wsc, &wnew);
    lpx_tensor_release(wsc);
    if (st) return st;
    lpx_tensor *qs[2] = {NULL, NULL};
    if (state && step > 0) {
        int64_t elems = lpx_tensor_numel(loc);
        if (whole) {
            for (int q = 0; q < 2 && !st; q++)
                st = lpx_optim_state_new((lpx_optim_state_format)(sfmt - 1), (lpx_optim_state_role)q,
                                         lpx_tensor_ndim(loc), lpx_tensor_shape(loc), sblock, lpx_cpu(), &qs[q]);
            if (st) goto out;
        } else if ((st = lpx_zeros(1, &elems, LPX_F32, lpx_cpu(), &m)) ||
                   (st = lpx_zeros(1, &elems, LPX_F32, lpx_cpu(), &v))) {
            goto out;
        }
    }
    int64_t row_elems = len ? lpx_tensor_numel(loc) / len : 0;
    /* a kind tensor with no dense master and shards that moved: its pieces
     * are re-cut through the kind's hooks (recut_kind) */
    const lpx_kind *kind = lpx_tensor_kind(loc);
    bool recut = false;
    if (kind && !lpx_kind_vtable(kind)->master && len) {
        int64_t chunk = 0, os = 0, ol = 0;
        for (int r = 0; r < o->ix->world && !st; r++) {
            if ((st = lpx_shard_range(rows, o->ix->world, r, unit, &chunk, &os, &ol))) break;
            if (os <= start && start < os + ol) {
                recut = !(os == start && ol == len);
                break;
            }
        }
    }
    if (kind && !lpx_kind_vtable(kind)->master && !len) {
        /* no rows here, but the empty shard still carries the tensor's
         * global parts (an NF4 scaler mean): take them from an empty slice
         * of a saved shard */
        int64_t chunk = 0, os = 0, ol = 0;
        int from = -1;
        bool empty = false;
        for (int r = 0; r < o->ix->world && !st && !empty; r++) {
            if ((st = lpx_shard_range(rows, o->ix->world, r, unit, &chunk, &os, &ol))) break;
            if (!ol || from < 0) {   /* a saved empty shard is the exact match; else a slice */
                from = r;
                empty = !ol;
            }
        }
        lpx_tensor *piece = NULL;
        if (!st && from >= 0 && !(st = old_rows(op, o, from, key, 0, 0, &piece))) {
            if (empty) {
                st = put_rows(op, key, loc, 0, 0, 0, piece);
            } else {
                /* a slice: its inner tensors only (the layout flags of an
                 * empty shard are the engine's own) */
                int ni = lpx_tensor_inner_count(loc);
                if (ni != lpx_tensor_inner_count(piece))
                    st = lpx_error(LPX_EINVAL, "%s: parameter '%s': the saved shard has another layout", op, key);
                for (int q = 0; q < ni && !st; q++) {
                    lpx_tensor *d = lpx_tensor_inner(loc, q), *sv = lpx_tensor_inner(piece, q);
                    if (lpx_tensor_numel(d) != lpx_tensor_numel(sv))
                        st = lpx_error(LPX_EINVAL, "%s: parameter '%s': an empty shard's inner tensor %d has %lld "
                                       "elements, the saved slice's %lld", op, key, q, (long long)lpx_tensor_numel(d),
                                       (long long)lpx_tensor_numel(sv));
                    else
                        st = lpx_copy_(d, sv);
                }
            }
        }
        lpx_tensor_release(piece);
    }
    lpx_tensor **pieces = NULL;
    int npieces = 0;
    if (recut && !(pieces = lpx_calloc((size_t)o->ix->world, sizeof *pieces)))
        st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    for (int r = 0; r < o->ix->world && !st; r++) {
        int64_t chunk = 0, os = 0, ol = 0;
        if ((st = lpx_shard_range(rows, o->ix->world, r, unit, &chunk, &os, &ol))) break;
        int64_t a = os > start ? os : start, b = os + ol < start + len ? os + ol : start + len;
        if (b <= a) continue;
        lpx_tensor *piece = NULL;
        if ((st = old_rows(op, o, r, key, a - os, b - a, &piece))) break;
        if (recut) {
            pieces[npieces++] = piece;
            continue;
        }
        st = put_rows(op, key, loc, a - start, b - a, len, piece);
        lpx_tensor_release(piece);
        if (!st && wnew) {
            /* the master's scales of these rows: whole blocks */
            int64_t from = (a - os) * row_elems, to = (a - start) * row_elems, n = (b - a) * row_elems;
            lpx_tensor *src = NULL, *x = NULL, *y = NULL;
            if (from % mblock || to % mblock)
                st = lpx_error(LPX_EINVAL, "%s: parameter '%s': a saved master piece at element %lld moves to %lld, not "
                               "on a block of %lld", op, key, (long long)from, (long long)to, (long long)mblock);
            int64_t cnt = blocks_at(from + n, mblock) - from / mblock;
            if (!st && !(st = saved_part(op, o, r, key, "#w.scales", &src)) &&
                !(st = lpx_narrow(src, 0, from / mblock, cnt, &x)) && !(st = lpx_narrow(wnew, 0, to / mblock, cnt, &y)))
                st = lpx_copy_(y, x);
            lpx_tensor_release(src);
            lpx_tensor_release(x);
            lpx_tensor_release(y);
        }
        if (!st && qs[0]) {
            st = state_blocks(op, o, r, key, sfmt - 1, sblock, (a - os) * row_elems, (a - start) * row_elems,
                              (b - a) * row_elems, qs);
            continue;
        }
        if (st || !m) continue;
        if (sfmt) {
            st = state_f32(op, o, r, key, sfmt - 1, sblock, ol * row_elems, (a - os) * row_elems,
                           (a - start) * row_elems, (b - a) * row_elems, m, v);
            continue;
        }
        /* the moments are flat f32 over the shard's elements: rows are runs */
        const char *mv[2] = {"#m", "#v"};
        lpx_tensor *dst[2] = {m, v};
        for (int j = 0; j < 2 && !st; j++) {
            lpx_safetensors *sf = NULL;
            lpx_tensor *t = NULL, *flat = NULL, *src = NULL, *dv = NULL;
            snprintf(name, sizeof name, "%s%s", key, mv[j]);
            int64_t all = -1;
            if (!(st = ck_open_rank(op, o, r, &sf)) && (st = lpx_safetensors_get(sf, name, &t)))
                st = lpx_error(st, "%s: rank %d's file lacks '%s'", op, r, name);
            if (!st) st = lpx_reshape(t, 1, &all, &flat);
            if (!st) st = lpx_narrow(flat, 0, (a - os) * row_elems, (b - a) * row_elems, &src);
            if (!st) st = lpx_narrow(dst[j], 0, (a - start) * row_elems, (b - a) * row_elems, &dv);
            if (!st) st = lpx_copy_(dv, src);
            lpx_tensor *tmp[4] = {t, flat, src, dv};
            for (int q = 0; q < 4; q++) lpx_tensor_release(tmp[q]);
        }
    }
    if (!st && recut) st = recut_kind(op, key, loc, pieces, npieces);
    for (int j = 0; j < npieces; j++) lpx_tensor_release(pieces[j]);
    lpx_free(pieces);
    if (!st && wnew) st = lpx_fsdp_param_set_master_scale(g, i, wnew);
    lpx_tensor_release(wnew);
    wnew = NULL;
    if (!st && state && qs[0]) st = lpx_fsdp_param_set_optim_state(g, i, qs[0], qs[1], step);
    else if (!st && state) st = lpx_fsdp_param_set_adamw_state(g, i, m, v, m ? step : 0);
out:
    lpx_tensor_release(wnew);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    lpx_tensor_release(qs[0]);
    lpx_tensor_release(qs[1]);
    return st;
}

lpx_status lpx_fsdp_load(lpx_fsdp *f, const char *dir) { return lpx_fsdp_load_ex(f, dir, NULL); }

lpx_status lpx_fsdp_load_ex(lpx_fsdp *f, const char *dir, const lpx_fsdp_ckpt_opts *opts)
{
    const char *op = "lpx_fsdp_load";
    ck_mesh cm;
    lpx_status st = lpx_ensure_init();
    if (st || (st = ck_check_engine(op, f, &cm))) return st;
    ck_index ix;
    ck_open o = {NULL, &ix, !(opts && (opts->flags & LPX_FSDP_CKPT_NO_VERIFY))};
    lpx_status mine = ck_read_index(op, dir, &ix);
    if ((st = ck_agree_index(&cm, op, dir ? dir : "", mine, ix.sum)) && !mine) {
        ck_index_free(&ix);
        return ck_agree_all(&cm, op, st);
    }
    if (!mine && !(o.f = lpx_calloc((size_t)ix.world, sizeof *o.f)))
        mine = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    char key[512];
    for (int gi = 0; gi < lpx_fsdp_group_count(f) && !mine; gi++) {
        lpx_fsdp_group *g = lpx_fsdp_group_at(f, gi);
        for (int i = 0; i < lpx_fsdp_param_count(g) && !mine; i++) {
            ck_key(g, i, key, sizeof key);
            int64_t unit = 1, saved_unit = 1;
            lpx_fsdp_param_rows(g, i, NULL, NULL, &unit);
            const cJSON *p = find_param(&ix, key);
            if (!p) mine = lpx_error(LPX_EINVAL, "%s: parameter '%s' is not in the checkpoint (another model?)", op, key);
            else if (!(mine = check_param(op, p, key, lpx_fsdp_param_dtensor(g, i), lpx_fsdp_param_local(g, i), unit,
                                          &saved_unit)))
                mine = load_param(op, &o, g, i, p, key, saved_unit);
        }
    }
    if (!mine && cJSON_GetArraySize(ix.params) != 0) {
        int n = 0;
        for (int gi = 0; gi < lpx_fsdp_group_count(f); gi++) n += lpx_fsdp_param_count(lpx_fsdp_group_at(f, gi));
        if (n != cJSON_GetArraySize(ix.params))
            mine = lpx_error(LPX_EINVAL, "%s: the checkpoint holds %d parameters, the engine %d (another model?)", op,
                             cJSON_GetArraySize(ix.params), n);
    }
    for (int r = 0; o.f && r < ix.world; r++) lpx_safetensors_close(o.f[r]);
    lpx_free(o.f);
    ck_index_free(&ix);
    return ck_agree_all(&cm, op, mine);
}
