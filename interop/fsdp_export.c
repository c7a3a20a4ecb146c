/* The consolidated model from and into a sharded engine (lpx_fsdp_export,
 * lpx_fsdp_import; include/lpx/checkpoint.h): one safetensors file that
 * every rank writes its own rows of, and reads its own rows from, so no
 * rank ever holds the model.
 *
 * A row shard of a row-major tensor is one contiguous byte range of the
 * tensor's data, so the file's layout is a function of the parameters'
 * global shapes alone: every rank computes the same header and offsets
 * (no collective needed for them), rank 0 writes the header and sizes the
 * file, each rank pwrite()s its rows and syncs them, and rank 0 renames
 * the finished file over the target. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fsdp_ckpt_internal.h"

typedef struct ex_param {
    lpx_fsdp_group *g;
    int i;
    int what;            /* 0 the parameter, 1 AdamW's exp_avg, 2 exp_avg_sq (LPX_FSDP_EXPORT_OPTIM_STATE) */
    int64_t row_bytes;   /* bytes of one row (dim 0) in the output dtype */
    uint64_t offset;     /* of the tensor's data, from the data's start */
} ex_param;

typedef struct ex_plan {
    ex_param *p;
    int n;
    char *header;        /* the JSON header, padded with spaces to 8 bytes */
    uint64_t header_len, data_len;
} ex_plan;

/* Parameter i of g's name in the file: the caller's name(), which may
 * leave it out (false), or its engine key. */
static bool out_name(lpx_fsdp_export_name_fn name, void *ctx, lpx_fsdp_group *g, int i, char *buf, size_t len)
{
    if (!name) {
        ck_key(g, i, buf, len);
        return true;
    }
    buf[0] = 0;
    if (!name(ctx, g, i, buf, len)) return false;
    buf[len - 1] = 0;
    return true;
}

static void plan_free(ex_plan *x)
{
    lpx_free(x->p);
    lpx_free(x->header);
    memset(x, 0, sizeof *x);
}

/* The exported parameters, their offsets and the header: the same on every
 * rank (a function of the engine's parameters and name()). */
static lpx_status make_plan(const char *op, lpx_fsdp *f, lpx_dtype dtype, lpx_fsdp_export_name_fn name, void *ctx,
                            int nmeta, const lpx_safetensors_kv *meta, unsigned flags, ex_plan *x)
{
    memset(x, 0, sizeof *x);
    int total = 0;
    for (int gi = 0; gi < lpx_fsdp_group_count(f); gi++) total += lpx_fsdp_param_count(lpx_fsdp_group_at(f, gi));
    if (flags & LPX_FSDP_EXPORT_OPTIM_STATE) total *= 3;
    lpx_status st = LPX_OK;
    cJSON *root = cJSON_CreateObject();
    x->p = lpx_calloc((size_t)total + 1, sizeof *x->p);
    if (!root || !x->p) {
        st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
        goto out;
    }
    if (nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int k = 0; m && k < nmeta && !st; k++) {
            if (!meta[k].key || !meta[k].value || !strcmp(meta[k].key, "")) {
                st = lpx_error(LPX_EINVAL, "%s: metadata pair %d has a NULL or empty key or a NULL value", op, k);
            } else if (!cJSON_AddStringToObject(m, meta[k].key, meta[k].value)) {
                st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
            }
        }
        if (!m && !st) st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    }
    uint64_t at = 0;
    size_t esz = lpx_dtype_nbytes(dtype, 1);
    char nm[512];
    for (int gi = 0; gi < lpx_fsdp_group_count(f) && !st; gi++) {
        lpx_fsdp_group *g = lpx_fsdp_group_at(f, gi);
        for (int i = 0; i < lpx_fsdp_param_count(g) && !st; i++)
        for (int what = 0; what < 3 && !st; what++) {
            /* the moments (dequantized f32 copies) after their parameter,
             * "<name>.exp_avg" and "<name>.exp_avg_sq", trainable only */
            if (what && (!(flags & LPX_FSDP_EXPORT_OPTIM_STATE) || (lpx_fsdp_param_flags(g, i) & LPX_FSDP_FROZEN)))
                break;
            if (!out_name(name, ctx, g, i, nm, sizeof nm)) break;
            if (what && strlen(nm) + 12 >= sizeof nm) {
                st = lpx_error(LPX_EINVAL, "%s: parameter name '%s' too long for its moments' names", op, nm);
                break;
            }
            if (what) strcat(nm, what == 1 ? ".exp_avg" : ".exp_avg_sq");
            if (!nm[0] || !strcmp(nm, "__metadata__")) {
                st = lpx_error(LPX_EINVAL, "%s: parameter '%s' of group '%s' is given the name '%s'", op,
                               lpx_fsdp_param_name(g, i), lpx_fsdp_group_name(g), nm);
                break;
            }
            if (cJSON_GetObjectItemCaseSensitive(root, nm)) {
                st = lpx_error(LPX_EINVAL, "%s: two parameters are given the name '%s' (the second: '%s' of group "
                               "'%s')", op, nm, lpx_fsdp_param_name(g, i), lpx_fsdp_group_name(g));
                break;
            }
            const lpx_tensor *dt = lpx_fsdp_param_dtensor(g, i);
            int nd = lpx_tensor_ndim(dt);
            const int64_t *sh = lpx_tensor_shape(dt);
            uint64_t numel = 1, row = esz;
            for (int d = 0; d < nd; d++) {
                if (sh[d] < 0 || (sh[d] && numel > UINT64_MAX / 4 / (uint64_t)sh[d])) {
                    st = lpx_error(LPX_EINVAL, "%s: parameter '%s': its size overflows", op, nm);
                    break;
                }
                numel *= (uint64_t)sh[d];
                if (d) row *= (uint64_t)sh[d];
            }
            if (st) break;
            uint64_t bytes = numel * esz;
            cJSON *e = cJSON_AddObjectToObject(root, nm), *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL,
                  *off = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
            bool ok = e && shape && off && cJSON_AddStringToObject(e, "dtype", dtype == LPX_BF16 ? "BF16" : "F32");
            for (int d = 0; ok && d < nd; d++) {
                cJSON *v = cJSON_CreateNumber((double)sh[d]);
                ok = v != NULL;
                if (v) cJSON_AddItemToArray(shape, v);
            }
            cJSON *b = ok ? cJSON_CreateNumber((double)at) : NULL, *en = b ? cJSON_CreateNumber((double)(at + bytes)) : NULL;
            if (b) cJSON_AddItemToArray(off, b);
            if (en) cJSON_AddItemToArray(off, en);
            if (!ok || !b || !en) {
                st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
                break;
            }
            x->p[x->n++] = (ex_param){g, i, what, (int64_t)row, at};
            at += bytes;
        }
    }
    if (st) goto out;
    /* offsets up to 2^53 print exactly as JSON numbers */
    if (at > ((uint64_t)1 << 53)) {
        st = lpx_error(LPX_EINVAL, "%s: the model's %llu bytes are beyond one safetensors file's exact offsets", op,
                       (unsigned long long)at);
        goto out;
    }
    char *text = cJSON_PrintUnformatted(root);
    if (!text) {
        st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
        goto out;
    }
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    x->header = lpx_malloc(padded + 1);
    if (x->header) {
        memcpy(x->header, text, n);
        memset(x->header + n, ' ', padded - n);
        x->header[padded] = 0;
    }
    cJSON_free(text);
    if (!x->header) st = lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    x->header_len = padded;
    x->data_len = at;
out:
    cJSON_Delete(root);
    if (st) plan_free(x);
    return st;
}

/* pwrite()s buf at `at` in chunks of 8 MiB, asking the kernel to start
 * writing each chunk back as soon as it is in the page cache (Linux
 * sync_file_range, no wait; as safetensors_write.c's write_all), so the
 * final fsync does not find the whole range still dirty. */
#define EX_KICK ((size_t)8 << 20)

static lpx_status pwrite_all(const char *path, int fd, const void *buf, size_t n, uint64_t at)
{
    const char *p = buf;
    while (n) {
        size_t c = n < EX_KICK ? n : EX_KICK;
        ssize_t w = pwrite(fd, p, c, (off_t)at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return lpx_error(LPX_EIO, "export %s: pwrite at %llu: %s", path, (unsigned long long)at,
                                     w < 0 ? strerror(errno) : "wrote nothing");
#ifdef __linux__
        (void)sync_file_range(fd, (off_t)at, (off_t)w, SYNC_FILE_RANGE_WRITE);
#endif
        p += w;
        n -= (size_t)w;
        at += (uint64_t)w;
    }
    return LPX_OK;
}

/* Rank 0: the temporary file, its header, its full size. */
/* The temporary next to path (a fresh name: never a file someone else
 * has there), its header written and its size set; its name into tmp. */
static lpx_status start_file(const char *path, char *tmp, size_t tmp_len, const ex_plan *x)
{
    if (snprintf(tmp, tmp_len, "%s.tmp-export.XXXXXX", path) >= (int)tmp_len) {
        tmp[0] = 0;
        return lpx_error(LPX_EINVAL, "lpx_fsdp_export: path is too long");
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        tmp[0] = 0;
        return lpx_error(LPX_EIO, "export %s: cannot create a temporary file next to it: %s", path, strerror(e));
    }
    if (fchmod(fd, 0644)) {
        close(fd);
        return lpx_error(LPX_EIO, "export %s: fchmod: %s", tmp, strerror(errno));
    }
    unsigned char len[8];
    for (int k = 0; k < 8; k++) len[k] = (unsigned char)(x->header_len >> (8 * k));
    lpx_status st = pwrite_all(tmp, fd, len, 8, 0);
    if (!st) st = pwrite_all(tmp, fd, x->header, (size_t)x->header_len, 8);
    if (!st && ftruncate(fd, (off_t)(8 + x->header_len + x->data_len)))
        st = lpx_error(LPX_EIO, "export %s: ftruncate: %s", tmp, strerror(errno));
    close(fd);
    return st;
}

/* This rank's rows of parameter P, dense in `dtype`, on the host. */
static lpx_status local_rows(const ex_param *P, lpx_dtype dtype, lpx_tensor **out)
{
    lpx_tensor *loc = lpx_fsdp_param_local(P->g, P->i), *dense = NULL, *host = NULL, *cast = NULL;
    const lpx_kind *k = lpx_tensor_kind(loc);
    lpx_status st = LPX_OK;
    if (P->what) {
        /* a moment: the engine's f32 copy (low-precision states dequantized;
         * zeros before the first step), the local shard's element count */
        lpx_tensor *mv[2] = {NULL, NULL};
        st = lpx_fsdp_param_adamw_state(P->g, P->i, &mv[0], &mv[1], NULL);
        if (!st) {
            dense = mv[P->what - 1];
            lpx_tensor_release(mv[2 - P->what]);
        }
    } else if (k && lpx_kind_vtable(k)->master) {
        dense = lpx_kind_vtable(k)->master(loc);
        lpx_tensor_retain(dense);
    } else if (k) {
        st = lpx_kind_to_dense(loc, &dense);
    } else {
        /* a scaled-f16 master's shard holds codes: dequantized */
        lpx_tensor *wsc = NULL;
        st = P->g && lpx_fsdp_param_flags(P->g, P->i) & LPX_FSDP_FROZEN ? LPX_OK : lpx_fsdp_param_master_scale(P->g, P->i, &wsc);
        if (!st && wsc) st = lpx_fsdp_param_master_dense(P->g, P->i, &dense);
        else if (!st) {
            dense = loc;
            lpx_tensor_retain(dense);
        }
        lpx_tensor_release(wsc);
    }
    if (!st) st = lpx_tensor_device(dense).type == LPX_DEVICE_CPU ? (lpx_tensor_retain(dense), host = dense, LPX_OK)
                                                                 : lpx_tensor_to(dense, lpx_cpu(), &host);
    if (!st && lpx_tensor_dtype(host) == dtype) {   /* no copy where none is needed */
        lpx_tensor_retain(host);
        cast = host;
    } else if (!st) {
        st = lpx_cast(host, dtype, false, &cast);
    }
    if (!st && lpx_tensor_is_contiguous(cast)) {
        lpx_tensor_retain(cast);
        *out = cast;
    } else if (!st) {
        st = lpx_contiguous(cast, out);
    }
    lpx_tensor_release(dense);
    lpx_tensor_release(host);
    lpx_tensor_release(cast);
    return st;
}

/* Every rank: its rows of every exported parameter, then fsync. */
static lpx_status write_rows(const char *tmp, const ex_plan *x, lpx_dtype dtype)
{
    int fd = open(tmp, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return lpx_error(LPX_EIO, "export %s: open: %s", tmp, strerror(errno));
    lpx_status st = LPX_OK;
    for (int j = 0; j < x->n && !st; j++) {
        const ex_param *P = &x->p[j];
        int64_t start = 0, len = 0;
        if ((st = lpx_fsdp_param_rows(P->g, P->i, &start, &len, NULL)) || !len) continue;
        lpx_tensor *rows = NULL;
        if ((st = local_rows(P, dtype, &rows))) break;
        uint64_t n = (uint64_t)len * (uint64_t)P->row_bytes;
        if ((uint64_t)lpx_dtype_nbytes(dtype, lpx_tensor_numel(rows)) != n)
            st = lpx_error(LPX_EINTERNAL, "export: parameter '%s': the local shard has %lld elements for %lld rows",
                           lpx_fsdp_param_name(P->g, P->i), (long long)lpx_tensor_numel(rows), (long long)len);
        else
            st = pwrite_all(tmp, fd, lpx_tensor_data(rows), (size_t)n,
                            8 + x->header_len + P->offset + (uint64_t)start * (uint64_t)P->row_bytes);
        lpx_tensor_release(rows);
    }
    if (!st && fsync(fd)) st = lpx_error(LPX_EIO, "export %s: fsync: %s", tmp, strerror(errno));
    close(fd);
    return st;
}

lpx_status lpx_fsdp_export(lpx_fsdp *f, const char *path, lpx_dtype dtype, lpx_fsdp_export_name_fn name, void *ctx,
                           int nmeta, const lpx_safetensors_kv *meta)
{
    return lpx_fsdp_export_ex(f, path, dtype, name, ctx, nmeta, meta, 0);
}

lpx_status lpx_fsdp_export_ex(lpx_fsdp *f, const char *path, lpx_dtype dtype, lpx_fsdp_export_name_fn name, void *ctx,
                              int nmeta, const lpx_safetensors_kv *meta, unsigned flags)
{
    const char *op = "lpx_fsdp_export";
    ck_mesh cm;
    lpx_status st = lpx_ensure_init();
    if (st || (st = ck_check_engine(op, f, &cm))) return st;
    lpx_status mine = LPX_OK;
    if (!path || !*path) mine = lpx_error(LPX_EINVAL, "%s: path is %s", op, path ? "empty" : "NULL");
    else if (strlen(path) > CK_PATH - 64) mine = lpx_error(LPX_EINVAL, "%s: path is too long", op);
    else if (dtype != LPX_F32 && dtype != LPX_BF16)
        mine = lpx_error(LPX_EINVAL, "%s: dtype %s (f32 or bf16)", op, lpx_dtype_name(dtype));
    else if (nmeta < 0 || (nmeta && !meta)) mine = lpx_error(LPX_EINVAL, "%s: nmeta %d with meta %p", op, nmeta, (const void *)meta);
    ex_plan x;
    memset(&x, 0, sizeof x);
    if (!mine && (flags & ~(unsigned)LPX_FSDP_EXPORT_OPTIM_STATE))
        mine = lpx_error(LPX_EINVAL, "%s: flags 0x%x: unknown bits (LPX_FSDP_EXPORT_*)", op, flags);
    if (!mine) mine = make_plan(op, f, dtype, name, ctx, nmeta, meta, flags, &x);
    /* the file written: a link's target, never a FIFO or a device
     * (lpx_output_path); the temporary beside it, its name from the lead */
    char real[CK_PATH] = "", tmp[CK_PATH] = "";
    /* replica 0 of a 2-D mesh writes; its shard rank 0 leads */
    bool writer = cm.replica_rank == 0, lead = writer && cm.rank == 0;
    if (!mine && lead) mine = lpx_output_path(op, path, real, sizeof real);
    if (!mine && lead) mine = start_file(real, tmp, sizeof tmp, &x);
    if ((st = ck_agree_all(&cm, op, mine))) goto out;
    if ((st = lpx_comm_broadcast_buf(cm.shard, tmp, sizeof tmp, 0))) goto out;
    if (writer) mine = write_rows(tmp, &x, dtype);
    if ((st = ck_agree_all(&cm, op, mine))) goto out;
    if (lead) {
        char dir[CK_PATH];
        snprintf(dir, sizeof dir, "%s", real);
        char *s = strrchr(dir, '/');
        if (!s) snprintf(dir, sizeof dir, ".");
        else if (s == dir) dir[1] = 0;
        else *s = 0;
        if (rename(tmp, real)) mine = lpx_error(LPX_EIO, "export %s: rename from %s: %s", real, tmp, strerror(errno));
        int dfd = mine ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    st = ck_agree_all(&cm, op, mine);
out:
    if (st && lead && tmp[0]) unlink(tmp);
    plan_free(&x);
    return st;
}

/* ---- import -------------------------------------------------------------- */

/* This rank's rows of one parameter from the tensor t (the whole, mapped). */
static lpx_status import_one(const char *op, const char *nm, lpx_fsdp_group *g, int i, lpx_tensor *t)
{
    lpx_tensor *dt = lpx_fsdp_param_dtensor(g, i), *loc = lpx_fsdp_param_local(g, i), *dst = loc;
    const lpx_kind *k = lpx_tensor_kind(loc);
    if (k) {
        if (!lpx_kind_vtable(k)->master)
            return lpx_error(LPX_ENOTIMPL, "%s: parameter '%s' is a %s tensor, which cannot be cut from rows of a dense "
                             "one (quantize the whole tensor and add it instead)", op, nm, lpx_kind_name(k));
        dst = lpx_kind_vtable(k)->master(loc);
    }
    lpx_tensor *wsc = NULL;
    if (!(lpx_fsdp_param_flags(g, i) & LPX_FSDP_FROZEN) && !lpx_fsdp_param_master_scale(g, i, &wsc) && wsc) {
        lpx_tensor_release(wsc);
        return lpx_error(LPX_ENOTIMPL, "%s: parameter '%s' keeps a scaled-f16 master: import before choosing it (not "
                         "done yet)", op, nm);
    }
    lpx_dtype td = lpx_tensor_dtype(t);
    bool ok = !lpx_tensor_kind(t) && (td == LPX_F32 || td == LPX_BF16 || td == LPX_F16) &&
              lpx_tensor_ndim(t) == lpx_tensor_ndim(dt);
    for (int d = 0; ok && d < lpx_tensor_ndim(dt); d++) ok = lpx_tensor_shape(t)[d] == lpx_tensor_shape(dt)[d];
    if (!ok) {
        char a[128], b[128];
        return lpx_error(LPX_EINVAL, "%s: '%s' is %s %s in the file; the parameter is %s (dense f32, bf16 or f16)", op,
                         nm, lpx_tensor_kind(t) ? lpx_kind_name(lpx_tensor_kind(t)) : lpx_dtype_name(td),
                         lpx_tensor_shape_str(t, a, sizeof a), lpx_tensor_shape_str(dt, b, sizeof b));
    }
    int64_t start = 0, len = 0;
    lpx_status st = lpx_fsdp_param_rows(g, i, &start, &len, NULL);
    if (st || !len) return st;
    lpx_tensor *rows = NULL, *cast = NULL;
    st = lpx_narrow(t, 0, start, len, &rows);
    if (!st) st = lpx_cast(rows, lpx_tensor_dtype(dst), false, &cast);
    if (!st) st = lpx_copy_(dst, cast);
    lpx_tensor_release(rows);
    lpx_tensor_release(cast);
    return st;
}

lpx_status lpx_fsdp_import(lpx_fsdp *f, int nfiles, lpx_safetensors *const *files, lpx_fsdp_export_name_fn name,
                           void *ctx)
{
    const char *op = "lpx_fsdp_import";
    ck_mesh cm;
    lpx_status st = lpx_ensure_init();
    if (st || (st = ck_check_engine(op, f, &cm))) return st;
    lpx_status mine = LPX_OK;
    if (nfiles < 1 || !files) mine = lpx_error(LPX_EINVAL, "%s: %d files%s", op, nfiles, files ? "" : " (NULL)");
    for (int j = 0; !mine && j < nfiles; j++)
        if (!files[j]) mine = lpx_error(LPX_EINVAL, "%s: files[%d] is NULL", op, j);
    char nm[512];
    for (int gi = 0; gi < lpx_fsdp_group_count(f) && !mine; gi++) {
        lpx_fsdp_group *g = lpx_fsdp_group_at(f, gi);
        for (int i = 0; i < lpx_fsdp_param_count(g) && !mine; i++) {
            if (!out_name(name, ctx, g, i, nm, sizeof nm)) continue;
            lpx_safetensors *sf = NULL;
            for (int j = 0; j < nfiles && !sf; j++)
                if (lpx_safetensors_kind_of(files[j], nm)) sf = files[j];
            if (!sf) {
                mine = lpx_error(LPX_EINVAL, "%s: no tensor '%s' (parameter '%s' of group '%s') in the %d file(s)", op,
                                 nm, lpx_fsdp_param_name(g, i), lpx_fsdp_group_name(g), nfiles);
                break;
            }
            lpx_tensor *t = NULL;
            if (!(mine = lpx_safetensors_get(sf, nm, &t))) mine = import_one(op, nm, g, i, t);
            lpx_tensor_release(t);
        }
    }
    return ck_agree_all(&cm, op, mine);
}
