/* Fuzz target: the safetensors reader. lpx_safetensors_open takes a path
 * (it maps the file), so the input is written to a memfd and opened as
 * /proc/self/fd/N. Every entry of a file that opens is then read: dense
 * entries (zero-copy or copied) are cast to f32, kind entries are rebuilt
 * through their kind's unflatten and dequantized, small float entries are
 * also quantized on load into float8, and the user metadata is listed. With
 * the MX plugin loaded (LPX_FUZZ_MX_PLUGIN), MX entries are rebuilt too.
 * With LPX_FUZZ_WRITE_SEEDS=DIR set, the target writes valid files (dense
 * tensors with metadata; float8, nf4 and MX tensors) into DIR and exits. */
#include <sys/mman.h>
#include <unistd.h>
#include "fuzz_util.h"
#include "lpx/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int mfd = -1;
static char mpath[64];

static void check(lpx_status st)
{
    if (st) {
        fprintf(stderr, "seed: %s\n", lpx_last_error());
        exit(1);
    }
}

static void write_seeds(const char *dir)
{
    char path[4096];
    int64_t s2[2] = {4, 8}, s1[1] = {5};
    lpx_tensor *a = NULL, *b = NULL, *c = NULL, *x = NULL;
    check(lpx_randn(2, s2, 1, LPX_F32, lpx_cpu(), &a));
    check(lpx_randn(1, s1, 2, LPX_BF16, lpx_cpu(), &b));
    check(lpx_arange(0, 6, 1, LPX_I64, lpx_cpu(), &c));
    const char *names[] = {"w", "b", "idx"};
    lpx_tensor *ts[] = {a, b, c};
    lpx_safetensors_kv kv[] = {{"format", "pt"}, {"note", "seed"}};
    snprintf(path, sizeof path, "%s/valid-dense.safetensors", dir);
    check(lpx_safetensors_save(path, 3, names, ts, 2, kv));
    printf("wrote %s\n", path);
    int64_t s3[2] = {64, 64};
    check(lpx_randn(2, s3, 3, LPX_F32, lpx_cpu(), &x));
    const char *kn[] = {"float8", "nf4", "mxfp4", "mxfp8"};
    for (size_t i = 0; i < sizeof kn / sizeof *kn; i++) {
        const lpx_kind *k;
        lpx_tensor *q = NULL;
        if (lpx_kind_find(kn[i], &k) || lpx_kind_from_dense(k, x, &q)) {
            printf("no seed for %s: %s\n", kn[i], lpx_last_error());
            continue;
        }
        const char *qn[] = {"q", "bias"};
        lpx_tensor *qt[] = {q, b};
        snprintf(path, sizeof path, "%s/valid-%s.safetensors", dir, kn[i]);
        check(lpx_safetensors_save(path, 2, qn, qt, 0, NULL));
        printf("wrote %s\n", path);
        lpx_tensor_release(q);
    }
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_tensor_release(c);
    lpx_tensor_release(x);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    fz_load_mx();
    const char *dir = getenv("LPX_FUZZ_WRITE_SEEDS");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    mfd = memfd_create("lpx-fuzz-safetensors", MFD_CLOEXEC);
    if (mfd < 0) { perror("memfd_create"); abort(); }
    snprintf(mpath, sizeof mpath, "/proc/self/fd/%d", mfd);
    return 0;
}

static void read_entry(lpx_safetensors *f, const char *name)
{
    lpx_tensor *t = NULL, *d = NULL;
    const char *kind = lpx_safetensors_kind_of(f, name);
    FZ_ASSERT(kind != NULL);
    lpx_status st = lpx_safetensors_get(f, name, &t);
    if (st) {
        FZ_ASSERT(t == NULL);
        return;
    }
    FZ_ASSERT((lpx_tensor_kind(t) != NULL) == (kind[0] != 0));
    if (lpx_tensor_numel(t) <= (1 << 18)) {
        if (lpx_tensor_kind(t)) st = lpx_kind_to_dense(t, &d);
        else st = lpx_cast(t, LPX_F32, true, &d);
        if (!st) lpx_tensor_release(d);
    }
    lpx_tensor_release(t);
    lpx_dtype dt = -1;
    /* quantize on load: float8 (nf4 pads small tensors to whole scaler
     * blocks, which would make this target 20x slower) */
    const lpx_kind *f8 = lpx_float8_kind();
    if (!kind[0] && f8 && lpx_safetensors_get(f, name, &t) == LPX_OK) {
        dt = lpx_tensor_dtype(t);
        bool small = lpx_tensor_numel(t) <= 4096 && lpx_tensor_numel(t) > 0;
        lpx_tensor_release(t);
        t = NULL;
        if (small && (dt == LPX_F32 || dt == LPX_BF16 || dt == LPX_F16) &&
            lpx_safetensors_get_quantized(f, name, f8, &t) == LPX_OK)
            lpx_tensor_release(t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (ftruncate(mfd, 0) || (size && pwrite(mfd, data, size, 0) != (ssize_t)size)) abort();
    lpx_safetensors *f = (lpx_safetensors *)1;
    lpx_status st = lpx_safetensors_open(mpath, &f);
    if (st) {
        FZ_ASSERT(f == NULL && lpx_last_error()[0]);
        return 0;
    }
    int n = lpx_safetensors_count(f);
    for (int i = 0; i < n; i++) {
        const char *name = lpx_safetensors_name(f, i);
        FZ_ASSERT(name != NULL);
        read_entry(f, name);
    }
    FZ_ASSERT(lpx_safetensors_name(f, n) == NULL);
    int nm = lpx_safetensors_metadata_count(f);
    for (int i = 0; i < nm; i++) {
        const char *v = NULL, *k = lpx_safetensors_metadata_at(f, i, &v);
        FZ_ASSERT(k && v && lpx_safetensors_metadata(f, k) != NULL);
    }
    lpx_safetensors_close(f);
    return 0;
}
