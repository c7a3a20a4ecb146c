/* The dtype table: built-in traits, name lookup, sizes, registration
 * (validation, uniqueness, capacity, concurrency), a packed plugin-style
 * dtype through lpx_convert, and the internal element accessors. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/dtype_internal.h"
#include "plugins/plugin_internal.h"   /* the registration journal: a plugin load, rolled back */

static const char *const builtin_names[LPX_DTYPE_BUILTIN_COUNT] = {
    "f32", "f16", "bf16", "f8e4m3fn", "f8e5m2", "u8", "i8", "i32", "i64", "bool"};

/* runs first: the built-in table must work before lpx_init() */
static void test_builtins_before_init(void)
{
    CHECK(lpx_dtype_count() >= LPX_DTYPE_BUILTIN_COUNT);
    for (int i = 0; i < LPX_DTYPE_BUILTIN_COUNT; i++) {
        CHECK(lpx_dtype_valid(i));
        CHECK(strcmp(lpx_dtype_name(i), builtin_names[i]) == 0);
        CHECK(lpx_dtype_from_name(builtin_names[i]) == i);
    }
    float one = 1.0f;
    uint8_t q = 0;
    CHECK_OK(lpx_convert(&q, LPX_F8E4M3FN, &one, LPX_F32, 1, 0));
    CHECK(q == 0x38);
}

static void test_init_keeps_table(void)
{
    int n = lpx_dtype_count();
    CHECK_OK(lpx_init());
    CHECK_OK(lpx_init()); /* idempotent */
    CHECK(lpx_dtype_count() == n);
    CHECK(lpx_dtype_from_name("bf16") == LPX_BF16);
}

static void test_builtin_traits(void)
{
    static const struct {
        int bits;
        bool is_float;
        int e, m;
        double max;
    } want[LPX_DTYPE_BUILTIN_COUNT] = {
        {32, true, 8, 23, FLT_MAX},          {16, true, 5, 10, 65504.0},
        {16, true, 8, 7, 0x1.fep127},        {8, true, 4, 3, 448.0},
        {8, true, 5, 2, 57344.0},            {8, false, 0, 0, 255.0},
        {8, false, 0, 0, 127.0},             {32, false, 0, 0, 2147483647.0},
        {64, false, 0, 0, 9223372036854775807.0}, {8, false, 0, 0, 1.0},
    };
    for (int i = 0; i < LPX_DTYPE_BUILTIN_COUNT; i++) {
        const lpx_dtype_traits *t = lpx_dtype_get(i);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECKF(t->struct_size == sizeof(lpx_dtype_traits) && t->bits == want[i].bits &&
                   t->block == 1 && t->is_float == want[i].is_float &&
                   t->exp_bits == want[i].e && t->mant_bits == want[i].m && t->max == want[i].max &&
                   t->to_f32 && t->from_f32,
               "traits of %s", builtin_names[i]);
        CHECK(lpx_dtype_nbytes(i, 10) == (size_t)(10 * want[i].bits / 8));
    }
    /* the traits functions are callable directly */
    float x[3] = {500.0f, -1.0f, NAN}, y[3];
    uint8_t q[3];
    lpx_dtype_get(LPX_F8E4M3FN)->from_f32(x, q, 3, LPX_CONVERT_SATURATE);
    CHECK(q[0] == 0x7E && q[1] == 0xB8 && q[2] == 0x7F);
    lpx_dtype_get(LPX_F8E4M3FN)->to_f32(q, y, 3);
    CHECK(y[0] == 448.0f && y[1] == -1.0f && isnan(y[2]));
}

static void test_lookup_errors(void)
{
    CHECK(lpx_dtype_from_name("nope") == LPX_ENOTFOUND);
    CHECK(strstr(lpx_last_error(), "nope") != NULL);
    CHECK(lpx_dtype_from_name("") < 0);
    CHECK(lpx_dtype_from_name("F32") < 0); /* names are case-sensitive */
    CHECK(lpx_dtype_from_name("f8e4m3") < 0);
    CHECK(lpx_dtype_from_name(NULL) < 0);
    int n = lpx_dtype_count();
    const lpx_dtype bad[5] = {-1, n, LPX_DTYPE_MAX, 1000, INT32_MIN};
    for (int i = 0; i < 5; i++) {
        CHECK(lpx_dtype_get(bad[i]) == NULL);
        CHECK(!lpx_dtype_valid(bad[i]));
        CHECK(strcmp(lpx_dtype_name(bad[i]), "?") == 0);
        CHECK(lpx_dtype_nbytes(bad[i], 4) == 0);
    }
    CHECK(lpx_dtype_nbytes(LPX_F32, 0) == 0);
    CHECK(lpx_dtype_nbytes(LPX_F32, -3) == 0);
    CHECK(lpx_dtype_nbytes(LPX_I64, 3) == 24);
    CHECK(lpx_dtype_nbytes(LPX_BOOL, 3) == 3);
    CHECK(lpx_dtype_nbytes(LPX_I64, INT64_MAX) == SIZE_MAX); /* overflow saturates */
}

/* ------------------------------------------------------------------ */
/* a plugin-style dtype: signed 4-bit integers, two per byte, the first
 * element in the high nibble */

static int t4_round(float x)
{
    if (isnan(x))
        return 0;
    if (x <= -8.0f)
        return -8;
    if (x >= 7.0f)
        return 7;
    return (int)nearbyintf(x); /* default mode: ties to even */
}

static void t4_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
        unsigned nib = (i & 1) ? s[i / 2] & 15u : s[i / 2] >> 4;
        dst[i] = (float)((int)nib - ((nib & 8) ? 16 : 0));
    }
}

static void t4_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    uint8_t *d = dst;
    (void)flags;
    for (size_t i = 0; i < n; i++) {
        unsigned nib = (unsigned)t4_round(src[i]) & 15u;
        if (i & 1)
            d[i / 2] = (uint8_t)((d[i / 2] & 0xF0u) | nib);
        else
            d[i / 2] = (uint8_t)((d[i / 2] & 0x0Fu) | (nib << 4));
    }
}

static lpx_dtype t4;

static lpx_dtype_traits t4_traits(const char *name)
{
    lpx_dtype_traits t = {.struct_size = sizeof(lpx_dtype_traits), .name = name, .bits = 4,
                          .block = 2, .is_float = false, .max = 7.0, .to_f32 = t4_to_f32,
                          .from_f32 = t4_from_f32};
    return t;
}

static void test_register(void)
{
    int n0 = lpx_dtype_count();
    char name[8] = "t4";
    lpx_dtype_traits tr = t4_traits(name);
    lpx_dtype d = -1;
    CHECK_OK(lpx_dtype_register(&tr, &d));
    t4 = d;
    CHECK(d == n0);
    CHECK(lpx_dtype_count() == n0 + 1);
    name[0] = 'X'; /* the name was copied */
    CHECK(strcmp(lpx_dtype_name(d), "t4") == 0);
    CHECK(lpx_dtype_from_name("t4") == d);
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    CHECK(t && t->bits == 4 && t->block == 2 && t->max == 7.0 && t->to_f32 == t4_to_f32);
    CHECK(lpx_dtype_nbytes(d, 3) == 2 && lpx_dtype_nbytes(d, 4) == 2 && lpx_dtype_nbytes(d, 1) == 1);

    /* duplicates */
    tr = t4_traits("t4");
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EEXIST);
    tr = t4_traits("f32");
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EEXIST);
    CHECK(strstr(lpx_last_error(), "f32") != NULL);

    /* invalid traits */
    CHECK_ERR(lpx_dtype_register(NULL, &d), LPX_EINVAL);
    tr = t4_traits(NULL);
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    tr = t4_traits("");
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    tr = t4_traits("a_name_that_is_much_too_long_for_the_dtype_table_of_lpx");
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    tr = t4_traits("bad");
    tr.to_f32 = NULL;
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "to_f32") != NULL);
    tr = t4_traits("bad");
    tr.from_f32 = NULL;
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    const int bad_bits[4] = {0, -8, 65, 128};
    for (int i = 0; i < 4; i++) {
        tr = t4_traits("bad");
        tr.bits = bad_bits[i];
        CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    }
    const int bad_block[4] = {-1, 3, 512, 1}; /* 1: 4-bit elements would split bytes */
    for (int i = 0; i < 4; i++) {
        tr = t4_traits("bad");
        tr.block = bad_block[i];
        CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    }
    tr = t4_traits("bad");
    tr.exp_bits = -1;
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    tr = t4_traits("bad");
    tr.struct_size = offsetof(lpx_dtype_traits, to_f32); /* does not reach the functions */
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "struct_size") != NULL);
    CHECK(lpx_dtype_count() == n0 + 1); /* failures left nothing behind */
    CHECK(lpx_dtype_from_name("bad") < 0);

    /* a caller with a newer, larger struct: only our part is read */
    struct {
        lpx_dtype_traits t;
        char future[32];
    } big;
    memset(&big, 0x7F, sizeof big);
    big.t = t4_traits("t4big");
    big.t.struct_size = sizeof big;
    CHECK_OK(lpx_dtype_register(&big.t, &d));
    CHECK(d == n0 + 1 && lpx_dtype_get(d)->struct_size == sizeof(lpx_dtype_traits));
    /* an older caller whose struct ends right after from_f32; block = 0
     * means unpacked */
    tr = t4_traits("u16ish");
    tr.bits = 16;
    tr.block = 0;
    tr.struct_size = offsetof(lpx_dtype_traits, from_f32) + sizeof(lpx_from_f32_fn);
    CHECK_OK(lpx_dtype_register(&tr, NULL)); /* out may be NULL */
    CHECK(lpx_dtype_from_name("u16ish") == n0 + 2);
    CHECK(lpx_dtype_get(n0 + 2)->block == 1 && lpx_dtype_nbytes(n0 + 2, 3) == 6);
}

static void test_registered_convert(void)
{
    enum { N = 2051 }; /* odd, and crosses the 1024-element chunks */
    static float x[N], y[N];
    static uint8_t p[(N + 1) / 2 + 8];
    static uint16_t b[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(i % 21 - 10) * 0.5f; /* -5 .. 5 by halves, ties included */
    memset(p, 0xEE, sizeof p);
    CHECK_OK(lpx_convert(p, t4, x, LPX_F32, N, 0));
    CHECK(p[(N + 1) / 2] == 0xEE); /* nothing past the last byte group */
    CHECK_OK(lpx_convert(y, LPX_F32, p, t4, N, 0));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += y[i] != (float)t4_round(x[i]);
    CHECK(bad == 0);
    /* packed -> another narrow dtype goes through f32 in chunks */
    CHECK_OK(lpx_convert(b, LPX_BF16, p, t4, N, 0));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += lpx_bf16_to_f32(b[i]) != (float)t4_round(x[i]);
    CHECK(bad == 0);
    /* and back, and integers into it (clamped) */
    static uint8_t p2[(N + 1) / 2];
    CHECK_OK(lpx_convert(p2, t4, b, LPX_BF16, N, 0));
    CHECK(memcmp(p, p2, N / 2) == 0);
    int64_t w[4] = {(int64_t)1 << 40, -3, -100, 6};
    uint8_t q[2];
    CHECK_OK(lpx_convert(q, t4, w, LPX_I64, 4, 0));
    CHECK(q[0] == 0x7D && q[1] == 0x86);
    /* same dtype: whole byte groups are copied */
    uint8_t r[2] = {0, 0};
    CHECK_OK(lpx_convert(r, t4, q, t4, 3, 0));
    CHECK(r[0] == 0x7D && r[1] == 0x86);
}

/* the inline element accessors agree with the bulk traits functions */
static void test_load_store(void)
{
    const float vals[8] = {0.0f, -2.5f, 3.0f, 300.0f, -1e6f, INFINITY, NAN, 0.1f};
    for (lpx_dtype d = 0; d < LPX_DTYPE_BUILTIN_COUNT; d++) {
        for (int sat = 0; sat < 2; sat++) {
            unsigned fl = sat ? LPX_CONVERT_SATURATE : 0;
            unsigned char a[64], c[64];
            float back[8], conv_back[8];
            memset(a, 0, sizeof a);
            for (int i = 0; i < 8; i++)
                lpx_store_f32(d, a, i, vals[i], fl);
            lpx_dtype_get(d)->from_f32(vals, c, 8, fl);
            CHECKF(memcmp(a, c, lpx_dtype_nbytes(d, 8)) == 0, "store %s sat=%d",
                   lpx_dtype_name(d), sat);
            for (int i = 0; i < 8; i++)
                back[i] = lpx_load_f32(d, a, i);
            lpx_dtype_get(d)->to_f32(a, conv_back, 8);
            CHECKF(memcmp(back, conv_back, sizeof back) == 0, "load %s", lpx_dtype_name(d));
        }
    }
    /* a packed registered dtype: one element changes, its neighbour stays */
    uint8_t p[32] = {0x12, 0x34}; /* sized for any dtype: gcc checks every case */
    lpx_store_f32(t4, p, 1, -1.0f, 0);
    lpx_store_f32(t4, p, 2, 7.6f, 0);
    CHECK(p[0] == 0x1F && p[1] == 0x74);
    CHECK(lpx_load_f32(t4, p, 0) == 1.0f && lpx_load_f32(t4, p, 1) == -1.0f);
    CHECK(lpx_load_f32(t4, p, 2) == 7.0f && lpx_load_f32(t4, p, 3) == 4.0f);
}

/* ------------------------------------------------------------------ */
/* concurrent registration with lock-free readers                      */

enum { NTHREADS = 8, PER_THREAD = 4 };
static lpx_dtype thread_got[NTHREADS][PER_THREAD];
static lpx_status race_status[NTHREADS];
static atomic_int readers_stop;
static atomic_int reader_errors;

static void *register_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int k = 0; k < PER_THREAD; k++) {
        char name[32];
        snprintf(name, sizeof name, "thr_%d_%d", id, k);
        lpx_dtype_traits tr = t4_traits(name);
        thread_got[id][k] = -1;
        if (lpx_dtype_register(&tr, &thread_got[id][k]) != LPX_OK)
            thread_got[id][k] = -2;
    }
    lpx_dtype_traits tr = t4_traits("race");
    race_status[id] = lpx_dtype_register(&tr, NULL);
    return NULL;
}

static void *reader(void *arg)
{
    (void)arg;
    while (!atomic_load(&readers_stop)) {
        int n = lpx_dtype_count();
        for (int i = 0; i < n; i++) {
            const lpx_dtype_traits *t = lpx_dtype_get(i);
            /* every published entry is complete */
            if (!t || !t->name || !t->name[0] || !t->to_f32 || !t->from_f32 || t->block < 1)
                atomic_fetch_add(&reader_errors, 1);
        }
    }
    return NULL;
}

static void test_register_concurrent(void)
{
    int n0 = lpx_dtype_count();
    pthread_t th[NTHREADS], rd[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&rd[i], NULL, reader, NULL) == 0);
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, register_worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&readers_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(rd[i], NULL);
    CHECK(atomic_load(&reader_errors) == 0);
    CHECK(lpx_dtype_count() == n0 + NTHREADS * PER_THREAD + 1);
    /* every index handed out once, and each name finds its own index */
    unsigned char seen[LPX_DTYPE_MAX] = {0};
    for (int i = 0; i < NTHREADS; i++) {
        for (int k = 0; k < PER_THREAD; k++) {
            lpx_dtype d = thread_got[i][k];
            CHECK(d >= n0 && d < LPX_DTYPE_MAX);
            if (d < 0 || d >= LPX_DTYPE_MAX)
                continue;
            CHECK(!seen[d]);
            seen[d] = 1;
            char name[32];
            snprintf(name, sizeof name, "thr_%d_%d", i, k);
            CHECK(lpx_dtype_from_name(name) == d);
        }
    }
    int ok = 0, exist = 0;
    for (int i = 0; i < NTHREADS; i++) {
        ok += race_status[i] == LPX_OK;
        exist += race_status[i] == LPX_EEXIST;
    }
    CHECK(ok == 1 && exist == NTHREADS - 1);
}

/* last: fills the table */
/* ---- rollback of a failed plugin load ---------------------------------
 * A "plugin" registers a dtype inside an open journal (what the loader
 * does), makes a tensor of it, and fails: the rollback retires the dtype.
 * The surviving tensor must keep meaning that dtype: its id is never handed
 * out again (the old code popped it and the next dtype took it, so the
 * tensor read as the new, wider dtype: a heap overflow under ASan). An id
 * no tensor was made of is handed out again (a loop of failing loads must
 * not exhaust the table). */
static lpx_dtype journaled_register(const char *name, int bits, bool make_tensor, lpx_tensor **t)
{
    lpx_journal j;
    lpx_dtype d = -1;
    CHECK_OK(lpx_journal_open(&j, NULL, NULL));
    lpx_dtype_traits tr = t4_traits(name);
    tr.bits = bits;
    tr.block = bits < 8 ? 8 / bits : 1;
    CHECK_OK(lpx_dtype_register(&tr, &d));
    int64_t shape[1] = {16};
    if (make_tensor) CHECK_OK(lpx_tensor_new(d, 1, shape, lpx_cpu(), t));
    lpx_journal_close(&j);
    lpx_journal_rollback(&j);  /* the plugin's init failed */
    lpx_journal_free(&j);
    return d;
}

static void test_rollback_never_reuses_a_used_id(void)
{
    lpx_tensor *t = NULL;
    lpx_dtype ghost = journaled_register("ghost4", 4, true, &t);
    CHECK(!lpx_dtype_valid(ghost) && lpx_dtype_from_name("ghost4") < 0);
    lpx_dtype_traits wide = t4_traits("wide_after");
    wide.bits = 64;
    wide.block = 1;
    lpx_dtype d = -1;
    CHECK_OK(lpx_dtype_register(&wide, &d));
    CHECKF(d != ghost, "the rolled-back id %d of a live tensor was handed out again", (int)ghost);
    /* the tensor still is 16 4-bit elements = 8 bytes, named ghost4 */
    if (t) {
        CHECK(lpx_tensor_dtype(t) == ghost && !strcmp(lpx_dtype_name(lpx_tensor_dtype(t)), "ghost4"));
        CHECK(lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t)) == 8);
    }
    lpx_tensor_release(t);
    /* no tensor made: the id comes back (failing loads do not use up ids) */
    lpx_dtype unused = journaled_register("ghost_unused", 4, false, NULL);
    lpx_dtype again = -1;
    lpx_dtype_traits tr = t4_traits("after_unused");
    CHECK_OK(lpx_dtype_register(&tr, &again));
    CHECK(again == unused && !strcmp(lpx_dtype_name(again), "after_unused"));
}

/* Readers never race a writer re-filling an id: readers walk the table's
 * names while a thread registers and rolls back dtypes in a loop (clean
 * under TSan: a reused id gets a new entry, published atomically). */
static atomic_int churn_stop;
static void *churn(void *arg)
{
    (void)arg;
    for (int k = 0; k < 200 && !atomic_load(&churn_stop); k++) {
        char name[32];
        snprintf(name, sizeof name, "churn_%d", k);
        (void)journaled_register(name, 4, false, NULL);
    }
    return NULL;
}

static void test_rollback_concurrent_readers(void)
{
    pthread_t w;
    atomic_store(&churn_stop, 0);
    CHECK(pthread_create(&w, NULL, churn, NULL) == 0);
    long reads = 0, bad = 0;
    for (int round = 0; round < 2000; round++) {
        int n = lpx_dtype_count();
        for (int i = 0; i < n; i++) {
            const char *nm = lpx_dtype_name(i);
            const lpx_dtype_traits *tr = lpx_dtype_get(i);
            reads++;
            if (!nm || !nm[0] || (tr && (!tr->to_f32 || tr->block < 1))) bad++;
        }
    }
    atomic_store(&churn_stop, 1);
    pthread_join(w, NULL);
    CHECKF(bad == 0, "%ld of %ld reads saw a torn entry", bad, reads);
}

static void test_register_full(void)
{
    lpx_status st = LPX_OK;
    int i = 0;
    while (st == LPX_OK && i < 2 * LPX_DTYPE_MAX) {
        char name[32];
        snprintf(name, sizeof name, "fill_%d", i++);
        lpx_dtype_traits tr = t4_traits(name);
        st = lpx_dtype_register(&tr, NULL);
    }
    CHECK_ERR(st, LPX_EFULL);
    CHECK(lpx_dtype_count() == LPX_DTYPE_MAX);
    CHECK(lpx_dtype_get(LPX_DTYPE_MAX - 1) != NULL);
    CHECK(lpx_dtype_get(LPX_DTYPE_MAX) == NULL);
    lpx_dtype_traits tr = t4_traits("one_more");
    lpx_dtype d = 12345;
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EFULL);
    CHECK(d == 12345); /* untouched on failure */
    tr = t4_traits("t4");
    CHECK_ERR(lpx_dtype_register(&tr, &d), LPX_EEXIST); /* a taken name stays EEXIST */
    char last[32];
    snprintf(last, sizeof last, "fill_%d", i - 2);
    CHECK(lpx_dtype_from_name(last) == LPX_DTYPE_MAX - 1);
    /* the old entries are intact */
    CHECK(lpx_dtype_from_name("t4") == t4 && lpx_dtype_from_name("bool") == LPX_BOOL);
}

int main(void)
{
    RUN(test_builtins_before_init);
    RUN(test_init_keeps_table);
    RUN(test_builtin_traits);
    RUN(test_lookup_errors);
    RUN(test_register);
    RUN(test_registered_convert);
    RUN(test_load_store);
    RUN(test_register_concurrent);
    RUN(test_rollback_never_reuses_a_used_id);
    RUN(test_rollback_concurrent_readers);
    RUN(test_register_full);
    return CHECK_DONE();
}
