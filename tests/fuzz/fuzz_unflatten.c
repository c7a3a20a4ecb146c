/* Fuzz target: kind unflatten (lpx_kind_vtable(kind)->unflatten) from
 * arbitrary inner tensors and metadata: float8, float8_weight, nf4 and,
 * with the MX plugin loaded (LPX_FUZZ_MX_PLUGIN, set by the build), the MX
 * kinds. This is what reading an untrusted checkpoint reaches.
 * Input:
 *   u8 kind (index into the registered kinds that have an unflatten slot,
 *      sorted by name), u8 logical dtype (as int8), u8 ndim (as int8),
 *      ndim x i64 shape, u8 ninner (mod LPX_MAX_INNER + 1), then per inner
 *      tensor: u8 layout (0xff: NULL; 1: a transposed view; 2: a view at a
 *      non-zero offset; 3: read-only; else contiguous), u8 dtype (mod the
 *      dtype count), u8 ndim (mod 5), ndim x u16 dims, and its bytes;
 *   then u16 meta_size (mod 2 * LPX_MAX_META) and the metadata bytes.
 * A tensor the kind accepts is then read back: describe, shard_unit,
 * to_dense, and a DLPack flatten/unflatten round trip; nothing the kind
 * accepted may make those read out of bounds.
 * With LPX_FUZZ_WRITE_SEEDS=DIR set, the target instead writes valid
 * seeds (each kind's from_dense of a small tensor) into DIR and exits. */
#include <stdbool.h>
#include "fuzz_util.h"
#include "lpx/dlpack.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const lpx_kind *kinds[64];
static int nkinds;

static int by_name(const void *a, const void *b)
{
    return strcmp(lpx_kind_name(*(const lpx_kind *const *)a), lpx_kind_name(*(const lpx_kind *const *)b));
}

/* ---- seeds: the encoding below, written from real tensors */

static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }

static void write_seed(const char *dir, int ki, lpx_tensor *t)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/valid-%s", dir, lpx_kind_name(kinds[ki]));
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    uint8_t b = (uint8_t)ki;
    put(f, &b, 1);
    b = (uint8_t)lpx_tensor_dtype(t);
    put(f, &b, 1);
    b = (uint8_t)lpx_tensor_ndim(t);
    put(f, &b, 1);
    put(f, lpx_tensor_shape(t), (size_t)lpx_tensor_ndim(t) * 8);
    b = (uint8_t)lpx_tensor_inner_count(t);
    put(f, &b, 1);
    for (int i = 0; i < lpx_tensor_inner_count(t); i++) {
        lpx_tensor *c = lpx_tensor_inner(t, i);
        if (lpx_tensor_is_contiguous(c)) lpx_tensor_retain(c);
        else if (lpx_contiguous(lpx_tensor_inner(t, i), &c)) { fprintf(stderr, "seed: %s\n", lpx_last_error()); exit(1); }
        b = 0;
        put(f, &b, 1);
        b = (uint8_t)lpx_tensor_dtype(c);
        put(f, &b, 1);
        b = (uint8_t)lpx_tensor_ndim(c);
        put(f, &b, 1);
        for (int d = 0; d < lpx_tensor_ndim(c); d++) {
            uint16_t v = (uint16_t)lpx_tensor_shape(c)[d];
            put(f, &v, 2);
        }
        int64_t bits = lpx_dtype_get(lpx_tensor_dtype(c))->bits;
        put(f, lpx_tensor_data(c), (size_t)((lpx_tensor_numel(c) * bits + 7) / 8));
        lpx_tensor_release(c);
    }
    size_t ms = 0;
    const void *meta = lpx_tensor_meta(t, &ms);
    uint16_t m16 = (uint16_t)ms;
    put(f, &m16, 2);
    put(f, meta, ms);
    fclose(f);
    printf("wrote %s\n", path);
}

static void write_seeds(const char *dir)
{
    int64_t shape[2] = {64, 64};
    lpx_tensor *x = NULL;
    if (lpx_randn(2, shape, 7, LPX_F32, lpx_cpu(), &x)) abort();
    for (int i = 0; i < nkinds; i++) {
        lpx_tensor *t = NULL;
        if (lpx_kind_from_dense(kinds[i], x, &t)) {
            printf("no seed for %s: %s\n", lpx_kind_name(kinds[i]), lpx_last_error());
            continue;
        }
        write_seed(dir, i, t);
        lpx_tensor_release(t);
    }
    lpx_tensor_release(x);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    fz_load_mx();
    for (int i = 0; i < lpx_kind_count() && nkinds < 64; i++) {
        const lpx_kind *k = lpx_kind_at(i);
        if (k && lpx_kind_vtable(k)->unflatten) kinds[nkinds++] = k;
    }
    qsort(kinds, (size_t)nkinds, sizeof *kinds, by_name);
    const char *dir = getenv("LPX_FUZZ_WRITE_SEEDS");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}

/* ---- the target */

/* One inner tensor from the input, or NULL (also when it would be big). */
static lpx_tensor *make_inner(fz *f, bool *skip)
{
    uint8_t layout = fz_u8(f);
    if (layout == 0xff) return NULL;
    lpx_dtype dt = (lpx_dtype)(fz_u8(f) % lpx_dtype_count());
    int nd = fz_u8(f) % 5;
    int64_t dims[4], alloc[4];
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        dims[i] = alloc[i] = fz_u16(f);
        numel *= dims[i] ? dims[i] : 1;
        if (numel > (1 << 16)) { *skip = true; return NULL; }
    }
    if (layout == 1 && nd >= 2) { alloc[nd - 2] = dims[nd - 1]; alloc[nd - 1] = dims[nd - 2]; }
    if (layout == 2 && nd >= 1) alloc[0] = dims[0] + 1;
    lpx_tensor *t = NULL;
    if (lpx_empty(nd, alloc, dt, lpx_cpu(), &t)) {
        *skip = true;   /* a dtype that cannot be allocated (sub-byte odd size...) */
        return NULL;
    }
    int64_t n = lpx_tensor_numel(t), bits = lpx_dtype_get(dt)->bits;
    fz_bytes(f, lpx_tensor_data(t), (size_t)((n * bits + 7) / 8));
    lpx_tensor *v = NULL;
    lpx_status st = LPX_OK;
    if (layout == 1 && nd >= 2) st = lpx_transpose(t, nd - 2, nd - 1, &v);
    else if (layout == 2 && nd >= 1) st = lpx_narrow(t, 0, 1, dims[0], &v);
    if (v || st) {
        lpx_tensor_release(t);
        t = v;
        if (st) { *skip = true; return NULL; }
    }
    if (layout == 3) lpx_tensor_mark_readonly(t);
    return t;
}

static void read_back(const lpx_kind *k, lpx_tensor *t)
{
    const lpx_kind_i *vt = lpx_kind_vtable(k);
    char buf[512];
    if (vt->describe) vt->describe(t, buf, sizeof buf);
    if (vt->shard_unit) (void)vt->shard_unit(t);
    lpx_tensor *d = NULL;
    if (lpx_tensor_numel(t) <= (1 << 18) && lpx_kind_to_dense(t, &d) == LPX_OK) {
        FZ_ASSERT(lpx_tensor_ndim(d) == lpx_tensor_ndim(t));
        lpx_tensor_release(d);
    }
    lpx_dlpack_flat flat;
    if (lpx_dlpack_flatten(t, &flat) == LPX_OK) {
        lpx_tensor *back = NULL;
        if (lpx_dlpack_unflatten(&flat, &back) == LPX_OK) lpx_tensor_release(back);
        lpx_dlpack_flat_release(&flat);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!nkinds) return 0;
    fz f = {data, size};
    const lpx_kind *k = kinds[fz_u8(&f) % nkinds];
    lpx_dtype logical = (lpx_dtype)(int8_t)fz_u8(&f);
    int ndim = (int8_t)fz_u8(&f);
    int64_t shape[16] = {0};
    if (ndim > 16) return -1;
    for (int i = 0; i < ndim; i++) shape[i] = (int64_t)fz_u64(&f);
    int ninner = fz_u8(&f) % (LPX_MAX_INNER + 1);
    lpx_tensor *inner[LPX_MAX_INNER] = {0};
    bool skip = false;
    for (int i = 0; i < ninner && !skip; i++) inner[i] = make_inner(&f, &skip);
    unsigned char meta[2 * LPX_MAX_META];
    size_t meta_size = fz_u16(&f) % (2 * LPX_MAX_META);
    fz_bytes(&f, meta, meta_size);

    if (!skip) {
        int64_t live = lpx_kind_live_tensors(k);
        lpx_tensor *out = (lpx_tensor *)1;
        lpx_status st = lpx_kind_vtable(k)->unflatten(k, logical, ndim, shape, inner, ninner, meta, meta_size, &out);
        if (st == LPX_OK) {
            FZ_ASSERT(out && lpx_tensor_kind(out) == k && lpx_tensor_ndim(out) == ndim);
            for (int i = 0; i < ndim; i++) FZ_ASSERT(lpx_tensor_shape(out)[i] == shape[i]);
            read_back(k, out);
            lpx_tensor_release(out);
        } else {
            FZ_ASSERT(out == NULL && lpx_last_error()[0]);
        }
        FZ_ASSERT(lpx_kind_live_tensors(k) == live);
    }
    for (int i = 0; i < ninner; i++) lpx_tensor_release(inner[i]);
    return 0;
}
