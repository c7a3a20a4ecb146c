/* Collectives over the local backend: property tests against references
 * computed here (all_gather == concatenation, reduce_scatter ==
 * reduce-then-shard, all_reduce, broadcast from every root) over world
 * sizes 1, 2, 3, 4, 8 and uneven byte counts; bit-reproducibility under
 * thread jitter; mixed dtypes in one u8 buffer; exact statistics; argument
 * errors; and the failure model: a rank that aborts, returns early, exits
 * its thread or stalls makes every other rank fail within the timeout.
 *
 * Rank functions never use CHECK (the counters are not thread-safe): they
 * store what they saw and the main thread checks it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "comm_util.h"

#define MAXR 8
static const int worlds[] = {1, 2, 3, 4, 8};
#define NWORLDS (int)(sizeof worlds / sizeof worlds[0])
#define TIMEOUT_MS 200

/* ---- helpers ------------------------------------------------------- */

/* The reference reduction, written independently of lpx's: decode with
 * lpx_convert, combine in rank order in f32, encode once (fp8: saturating,
 * the comm layer's documented rule). */
static void ref_reduce(void *dst, void *const *srcs, int n, size_t count, lpx_dtype d, lpx_reduce_op op)
{
    float *acc = malloc((count ? count : 1) * sizeof *acc), *x = malloc((count ? count : 1) * sizeof *x);
    lpx_convert(acc, LPX_F32, srcs[0], d, count, 0);
    for (int q = 1; q < n; q++) {
        lpx_convert(x, LPX_F32, srcs[q], d, count, 0);
        for (size_t i = 0; i < count; i++) {
            float a = acc[i], b = x[i];
            if (op == LPX_REDUCE_SUM || op == LPX_REDUCE_AVG) acc[i] = a + b;
            else if (isnan(a) || isnan(b)) acc[i] = isnan(a) ? a : b;
            else if (op == LPX_REDUCE_MAX) acc[i] = b > a ? b : a;
            else acc[i] = b < a ? b : a;
        }
    }
    if (op == LPX_REDUCE_AVG)
        for (size_t i = 0; i < count; i++) acc[i] /= (float)n;
    bool fp8 = d == LPX_F8E4M3FN || d == LPX_F8E5M2;
    lpx_convert(dst, d, acc, LPX_F32, count, fp8 ? LPX_CONVERT_SATURATE : 0);
    free(acc);
    free(x);
}

/* ---- one collective per run: buffers prepared and checked by main --- */

typedef struct job {
    lpx_coll kind;
    int n;
    void *send[MAXR], *recv[MAXR];
    size_t count, nbytes;
    lpx_dtype dtype;
    lpx_reduce_op op;
    int root;
    lpx_status st[MAXR];
    char msg[MAXR][512];
} job;

static lpx_status job_rank(lpx_comm *c, void *ctx)
{
    job *j = ctx;
    int r = lpx_comm_rank(c);
    lpx_status st = LPX_EINTERNAL;
    switch (j->kind) {
    case LPX_COLL_ALL_GATHER: st = lpx_comm_all_gather_buf(c, j->send[r], j->recv[r], j->nbytes); break;
    case LPX_COLL_REDUCE_SCATTER:
        st = lpx_comm_reduce_scatter_buf(c, j->send[r], j->recv[r], j->count, j->dtype, j->op);
        break;
    case LPX_COLL_ALL_REDUCE:
        st = lpx_comm_all_reduce_buf(c, j->send[r], j->recv[r], j->count, j->dtype, j->op);
        break;
    case LPX_COLL_BROADCAST: st = lpx_comm_broadcast_buf(c, j->recv[r], j->nbytes, j->root); break;
    case LPX_COLL_BARRIER: st = lpx_comm_barrier(c); break;
    default: break;
    }
    j->st[r] = st;
    snprintf(j->msg[r], sizeof j->msg[r], "%s", st ? lpx_last_error() : "");
    return st;
}

static bool run_job(job *j)
{
    lpx_status st = lpx_local_run(j->n, job_rank, j, 5000, NULL);
    bool ok = st == LPX_OK;
    for (int r = 0; r < j->n; r++)
        CHECKF(j->st[r] == LPX_OK, "%s n=%d rank %d: %s", lpx_coll_name(j->kind), j->n, r, j->msg[r]);
    return ok;
}

static void free_job(job *j)
{
    for (int r = 0; r < MAXR; r++) {
        free(j->send[r]);
        if (j->recv[r] != j->send[r]) free(j->recv[r]);
        j->send[r] = j->recv[r] = NULL;
    }
}

/* ---- properties ---------------------------------------------------- */

static const size_t byte_counts[] = {0, 1, 7, 64, 1000, 4099};

static void test_all_gather_is_concatenation(void)
{
    for (int w = 0; w < NWORLDS; w++)
        for (size_t b = 0; b < sizeof byte_counts / sizeof *byte_counts; b++)
            for (int inplace = 0; inplace < 2; inplace++) {
                int n = worlds[w];
                size_t nb = byte_counts[b];
                job j = {.kind = LPX_COLL_ALL_GATHER, .n = n, .nbytes = nb};
                unsigned char *want = malloc(nb * (size_t)n + 1);
                seed(1000 + (uint64_t)n * 10 + b);
                for (int r = 0; r < n; r++) {
                    j.recv[r] = malloc(nb * (size_t)n + 1);
                    memset(j.recv[r], 0xEE, nb * (size_t)n);
                    unsigned char *s = inplace ? (unsigned char *)j.recv[r] + (size_t)r * nb : malloc(nb + 1);
                    for (size_t i = 0; i < nb; i++) s[i] = (unsigned char)rnd();
                    memcpy(want + (size_t)r * nb, s, nb);
                    j.send[r] = s;
                }
                if (run_job(&j))
                    for (int r = 0; r < n; r++)
                        CHECKF(!memcmp(j.recv[r], want, nb * (size_t)n), "n=%d nbytes=%zu inplace=%d rank %d",
                               n, nb, inplace, r);
                if (inplace) for (int r = 0; r < n; r++) j.send[r] = NULL;
                free_job(&j);
                free(want);
            }
}

static const size_t elem_counts[] = {0, 1, 5, 33, 1031};
static const lpx_dtype red_dtypes[] = {LPX_F32, LPX_BF16, LPX_F16};
static const lpx_reduce_op red_ops[] = {LPX_REDUCE_SUM, LPX_REDUCE_AVG, LPX_REDUCE_MAX, LPX_REDUCE_MIN};

static void test_reduce_scatter_is_reduce_then_shard(void)
{
    for (int w = 0; w < NWORLDS; w++)
        for (size_t c = 0; c < sizeof elem_counts / sizeof *elem_counts; c++)
            for (int di = 0; di < 3; di++)
                for (int oi = 0; oi < 4; oi++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        int n = worlds[w];
                        size_t cnt = elem_counts[c];
                        lpx_dtype d = red_dtypes[di];
                        size_t es = lpx_dtype_nbytes(d, 1), total = cnt * (size_t)n;
                        job j = {.kind = LPX_COLL_REDUCE_SCATTER, .n = n, .count = cnt, .dtype = d,
                                 .op = red_ops[oi]};
                        seed(2000 + (uint64_t)(n * 1000 + (int)c * 100 + di * 10 + oi));
                        for (int r = 0; r < n; r++) {
                            j.send[r] = malloc(total * es + 1);
                            fill_random(j.send[r], d, total);
                            j.recv[r] = inplace ? (unsigned char *)j.send[r] + (size_t)r * cnt * es
                                                : malloc(cnt * es + 1);
                        }
                        unsigned char *full = malloc(total * es + 1);
                        ref_reduce(full, j.send, n, total, d, j.op);
                        if (run_job(&j))
                            for (int r = 0; r < n; r++)
                                CHECKF(!memcmp(j.recv[r], full + (size_t)r * cnt * es, cnt * es),
                                       "n=%d count=%zu %s %s inplace=%d rank %d", n, cnt, lpx_dtype_name(d),
                                       lpx_reduce_op_name(j.op), inplace, r);
                        if (inplace) for (int r = 0; r < n; r++) j.recv[r] = j.send[r];
                        free_job(&j);
                        free(full);
                    }
}

static void test_all_reduce_matches_reference(void)
{
    for (int w = 0; w < NWORLDS; w++)
        for (size_t c = 0; c < sizeof elem_counts / sizeof *elem_counts; c++)
            for (int di = 0; di < 3; di++)
                for (int oi = 0; oi < 4; oi++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        int n = worlds[w];
                        size_t cnt = elem_counts[c];
                        lpx_dtype d = red_dtypes[di];
                        size_t es = lpx_dtype_nbytes(d, 1);
                        job j = {.kind = LPX_COLL_ALL_REDUCE, .n = n, .count = cnt, .dtype = d, .op = red_ops[oi]};
                        seed(3000 + (uint64_t)(n * 1000 + (int)c * 100 + di * 10 + oi));
                        void *orig[MAXR];
                        for (int r = 0; r < n; r++) {
                            orig[r] = malloc(cnt * es + 1);
                            fill_random(orig[r], d, cnt);
                            j.send[r] = malloc(cnt * es + 1);
                            memcpy(j.send[r], orig[r], cnt * es);
                            j.recv[r] = inplace ? j.send[r] : malloc(cnt * es + 1);
                        }
                        unsigned char *want = malloc(cnt * es + 1);
                        ref_reduce(want, orig, n, cnt, d, j.op);
                        if (run_job(&j))
                            for (int r = 0; r < n; r++) {
                                CHECKF(!memcmp(j.recv[r], want, cnt * es), "n=%d count=%zu %s %s inplace=%d rank %d",
                                       n, cnt, lpx_dtype_name(d), lpx_reduce_op_name(j.op), inplace, r);
                                if (!inplace) CHECK(!memcmp(j.send[r], orig[r], cnt * es));  /* input untouched */
                            }
                        for (int r = 0; r < n; r++) free(orig[r]);
                        free_job(&j);
                        free(want);
                    }
}

/* fp8 reductions: 1 byte per element on the wire, bit-exact against the
 * reference (decode, sum in rank order in f32, encode once saturating),
 * over every world size 1..8, both formats, every op, in and out of
 * place; reduce-scatter and all-reduce. */
typedef struct fp8_job {
    job j;
    uint64_t rs_bytes[MAXR];
} fp8_job;

static lpx_status fp8_rank(lpx_comm *c, void *ctx)
{
    fp8_job *f = ctx;
    lpx_status st = job_rank(c, &f->j);
    lpx_comm_stats s = {.struct_size = sizeof s};
    lpx_comm_stats_get(c, &s);
    f->rs_bytes[lpx_comm_rank(c)] = s.bytes[f->j.kind];
    return st;
}

static void test_fp8_reductions_match_reference(void)
{
    static const lpx_dtype f8[] = {LPX_F8E4M3FN, LPX_F8E5M2};
    static const lpx_coll colls[] = {LPX_COLL_REDUCE_SCATTER, LPX_COLL_ALL_REDUCE};
    for (int n = 1; n <= MAXR; n++)
        for (size_t c = 0; c < sizeof elem_counts / sizeof *elem_counts; c++)
            for (int di = 0; di < 2; di++)
                for (int oi = 0; oi < 4; oi++)
                    for (int ci = 0; ci < 2; ci++)
                        for (int inplace = 0; inplace < 2; inplace++) {
                            size_t cnt = elem_counts[c], total = colls[ci] == LPX_COLL_REDUCE_SCATTER ? cnt * (size_t)n : cnt;
                            lpx_dtype d = f8[di];
                            fp8_job f;
                            memset(&f, 0, sizeof f);
                            f.j = (job){.kind = colls[ci], .n = n, .count = cnt, .dtype = d, .op = red_ops[oi]};
                            seed(7000 + (uint64_t)(n * 1000 + (int)c * 100 + di * 10 + oi + 50 * ci));
                            void *orig[MAXR];
                            for (int r = 0; r < n; r++) {
                                orig[r] = malloc(total + 1);
                                fill_random(orig[r], d, total);
                                f.j.send[r] = malloc(total + 1);
                                memcpy(f.j.send[r], orig[r], total);
                                if (colls[ci] == LPX_COLL_REDUCE_SCATTER)
                                    f.j.recv[r] = inplace ? (unsigned char *)f.j.send[r] + (size_t)r * cnt
                                                          : malloc(cnt + 1);
                                else
                                    f.j.recv[r] = inplace ? f.j.send[r] : malloc(cnt + 1);
                            }
                            unsigned char *want = malloc(total + 1);
                            ref_reduce(want, orig, n, total, d, f.j.op);
                            lpx_status st = lpx_local_run(n, fp8_rank, &f, 5000, NULL);
                            CHECKF(st == LPX_OK, "fp8 %s n=%d: %s", lpx_coll_name(f.j.kind), n, f.j.msg[0]);
                            for (int r = 0; !st && r < n; r++) {
                                const unsigned char *w = colls[ci] == LPX_COLL_REDUCE_SCATTER ? want + (size_t)r * cnt
                                                                                               : want;
                                CHECKF(!memcmp(f.j.recv[r], w, cnt), "%s n=%d count=%zu %s %s inplace=%d rank %d",
                                       lpx_coll_name(f.j.kind), n, cnt, lpx_dtype_name(d),
                                       lpx_reduce_op_name(f.j.op), inplace, r);
                                /* one byte per element: the whole input of a reduce-scatter, the buffer of an all-reduce */
                                CHECK(f.rs_bytes[r] == (uint64_t)total);
                            }
                            if (inplace && colls[ci] == LPX_COLL_REDUCE_SCATTER)
                                for (int r = 0; r < n; r++) f.j.recv[r] = f.j.send[r];
                            for (int r = 0; r < n; r++) free(orig[r]);
                            free_job(&f.j);
                            free(want);
                        }
}

/* fp8 sums saturate instead of overflowing (e4m3fn has no inf: the
 * non-saturating encoding would give NaN); NaN still propagates. */
static void test_fp8_reduction_saturates(void)
{
    static const lpx_dtype f8[] = {LPX_F8E4M3FN, LPX_F8E5M2};
    for (int di = 0; di < 2; di++) {
        lpx_dtype d = f8[di];
        float mx = (float)lpx_dtype_get(d)->max, vals[4] = {mx, -mx, mx, NAN}, other[4] = {mx, -mx, -mx, 1.0f};
        uint8_t a[4], b[4], out[4];
        lpx_convert(a, d, vals, LPX_F32, 4, 0);
        lpx_convert(b, d, other, LPX_F32, 4, 0);
        const void *srcs[2] = {a, b};
        CHECK_OK(lpx_comm_reduce_buffers(out, srcs, 2, 4, d, LPX_REDUCE_SUM));
        float back[4];
        lpx_convert(back, LPX_F32, out, d, 4, 0);
        CHECKF(back[0] == mx && back[1] == -mx && back[2] == 0.0f && isnan(back[3]),
               "%s: max+max %g, -max-max %g, max-max %g, NaN+1 %g", lpx_dtype_name(d), (double)back[0],
               (double)back[1], (double)back[2], (double)back[3]);
        CHECK_OK(lpx_comm_reduce_buffers(out, srcs, 2, 4, d, LPX_REDUCE_AVG));
        lpx_convert(back, LPX_F32, out, d, 4, 0);
        CHECK(back[0] == mx && back[1] == -mx && back[2] == 0.0f);
        /* rounding once: 1 + 1/16 + 1/16 is 1.125 in e4m3fn (3 mantissa
         * bits), while rounding after each add would give 1 twice */
        if (d == LPX_F8E4M3FN) {
            float u = 1.0f, e = 1.0f / 16.0f;
            uint8_t cu, ce, r;
            lpx_convert(&cu, d, &u, LPX_F32, 1, 0);
            lpx_convert(&ce, d, &e, LPX_F32, 1, 0);
            const void *three[3] = {&cu, &ce, &ce};
            CHECK_OK(lpx_comm_reduce_buffers(&r, three, 3, 1, d, LPX_REDUCE_SUM));
            float rb;
            lpx_convert(&rb, LPX_F32, &r, d, 1, 0);
            CHECKF(rb == 1.125f, "1 + 1/16 + 1/16 in e4m3fn gave %g", (double)rb);
        }
    }
}

static void test_broadcast_from_every_root(void)
{
    for (int w = 0; w < NWORLDS; w++)
        for (int root = 0; root < worlds[w]; root++)
            for (size_t b = 0; b < sizeof byte_counts / sizeof *byte_counts; b++) {
                int n = worlds[w];
                size_t nb = byte_counts[b];
                job j = {.kind = LPX_COLL_BROADCAST, .n = n, .nbytes = nb, .root = root};
                seed(4000 + (uint64_t)(n * 100 + root * 10) + b);
                for (int r = 0; r < n; r++) {
                    j.recv[r] = malloc(nb + 1);
                    for (size_t i = 0; i < nb; i++) ((unsigned char *)j.recv[r])[i] = (unsigned char)rnd();
                }
                unsigned char *want = malloc(nb + 1);
                memcpy(want, j.recv[root], nb);
                if (run_job(&j))
                    for (int r = 0; r < n; r++)
                        CHECKF(!memcmp(j.recv[r], want, nb), "n=%d root=%d nbytes=%zu rank %d", n, root, nb, r);
                free_job(&j);
                free(want);
            }
}

/* ---- bit-reproducibility under thread jitter ------------------------ */

#define REPRO_COUNT 4097
typedef struct repro {
    uint32_t jitter_seed;
    void *in[MAXR];       /* bf16 inputs per rank */
    void *out[MAXR];      /* all_reduce sum then reduce_scatter avg results */
} repro;

static lpx_status repro_rank(lpx_comm *c, void *ctx)
{
    repro *p = ctx;
    int r = lpx_comm_rank(c), n = lpx_comm_size(c);
    uint32_t s = p->jitter_seed * 7919u + (uint32_t)r * 104729u + 1u;
    unsigned char *buf = p->out[r];
    memcpy(buf, p->in[r], REPRO_COUNT * 2 * (size_t)n);
    for (int step = 0; step < 6; step++) {
        s = s * 1664525u + 1013904223u;
        struct timespec ts = {0, (long)(s >> 8) % 300000L};  /* up to 0.3 ms of jitter */
        nanosleep(&ts, NULL);
        lpx_status st = step % 2 ? lpx_comm_all_reduce_buf(c, buf, buf, REPRO_COUNT * (size_t)n, LPX_BF16, LPX_REDUCE_SUM)
                                 : lpx_comm_all_reduce_buf(c, buf, buf, REPRO_COUNT * (size_t)n, LPX_BF16, LPX_REDUCE_AVG);
        if (st) return st;
    }
    return lpx_comm_reduce_scatter_buf(c, buf, buf + (size_t)r * REPRO_COUNT * 2, REPRO_COUNT, LPX_BF16,
                                       LPX_REDUCE_SUM);
}

static void test_bit_reproducible_across_runs(void)
{
    for (int w = 1; w < NWORLDS; w++) {
        int n = worlds[w];
        repro a = {.jitter_seed = 1}, b = {.jitter_seed = 2};
        seed(5000 + (uint64_t)n);
        for (int r = 0; r < n; r++) {
            a.in[r] = b.in[r] = malloc(REPRO_COUNT * 2 * (size_t)n);
            fill_random(a.in[r], LPX_BF16, REPRO_COUNT * (size_t)n);
            a.out[r] = malloc(REPRO_COUNT * 2 * (size_t)n);
            b.out[r] = malloc(REPRO_COUNT * 2 * (size_t)n);
        }
        CHECK_OK(lpx_local_run(n, repro_rank, &a, 5000, NULL));
        CHECK_OK(lpx_local_run(n, repro_rank, &b, 5000, NULL));
        for (int r = 0; r < n; r++) {
            CHECKF(!memcmp(a.out[r], b.out[r], REPRO_COUNT * 2 * (size_t)n), "n=%d rank %d differs between runs", n, r);
            /* blocks no reduce_scatter wrote hold the replicated all_reduce result */
            for (int q = 1; q < n; q++)
                if (q != r)
                    CHECK(!memcmp((char *)a.out[r] + (size_t)q * REPRO_COUNT * 2,
                                  (char *)a.out[0] + (size_t)q * REPRO_COUNT * 2, REPRO_COUNT * 2));
        }
        for (int r = 0; r < n; r++) {
            free(a.in[r]);
            free(a.out[r]);
            free(b.out[r]);
        }
    }
}

/* ---- mixed dtypes packed in one u8 buffer, tensors ------------------ */

/* Each rank packs 5 f8e4m3fn values, 3 bf16 values and one f32 into a
 * 24-byte slot (padding included), like the sharding engine packs a group. */
#define SLOT 24
typedef struct mixed {
    lpx_tensor *send[MAXR], *recv[MAXR];
    lpx_status st[MAXR];
} mixed;

static void pack(unsigned char *slot, int r)
{
    float f8v[5], bfv[3], f32v = 1000.5f + (float)r;
    for (int i = 0; i < 5; i++) f8v[i] = (float)(r + i) * 0.5f - 1.0f;  /* exact in e4m3 */
    for (int i = 0; i < 3; i++) bfv[i] = (float)(r + 1) * (i + 1) * 1.5f;
    memset(slot, 0, SLOT);
    lpx_convert(slot, LPX_F8E4M3FN, f8v, LPX_F32, 5, 0);
    lpx_convert(slot + 6, LPX_BF16, bfv, LPX_F32, 3, 0);  /* 1 byte of padding before: 2-byte aligned */
    memcpy(slot + 12, &f32v, 4);
}

static lpx_status mixed_rank(lpx_comm *c, void *ctx)
{
    mixed *m = ctx;
    int r = lpx_comm_rank(c);
    return m->st[r] = lpx_comm_all_gather(c, m->send[r], m->recv[r]);
}

static void test_mixed_dtypes_in_one_buffer(void)
{
    for (int w = 0; w < NWORLDS; w++) {
        int n = worlds[w];
        mixed m = {0};
        for (int r = 0; r < n; r++) {
            int64_t s1[1] = {SLOT}, s2[2] = {n, SLOT};
            CHECK_OK(lpx_tensor_new(LPX_U8, 1, s1, lpx_cpu(), &m.send[r]));
            CHECK_OK(lpx_tensor_new(LPX_U8, 2, s2, lpx_cpu(), &m.recv[r]));
            pack(lpx_tensor_data(m.send[r]), r);
        }
        CHECK_OK(lpx_local_run(n, mixed_rank, &m, 5000, NULL));
        for (int r = 0; r < n; r++) {
            const unsigned char *got = lpx_tensor_data(m.recv[r]);
            for (int q = 0; q < n; q++) {
                unsigned char want[SLOT];
                pack(want, q);
                CHECKF(!memcmp(got + q * SLOT, want, SLOT), "n=%d rank %d slot of rank %d", n, r, q);
                float f32v, bfv[3], f8v[5];
                memcpy(&f32v, got + q * SLOT + 12, 4);
                lpx_convert(bfv, LPX_F32, got + q * SLOT + 6, LPX_BF16, 3, 0);
                lpx_convert(f8v, LPX_F32, got + q * SLOT, LPX_F8E4M3FN, 5, 0);
                CHECK(f32v == 1000.5f + (float)q);
                CHECK(bfv[2] == (float)(q + 1) * 4.5f);
                CHECK(f8v[4] == (float)(q + 4) * 0.5f - 1.0f);
            }
            lpx_tensor_release(m.send[r]);
            lpx_tensor_release(m.recv[r]);
        }
    }
}

/* fp8 tensors gathered as fp8, and a bf16 tensor reduce-scattered. */
typedef struct tens {
    lpx_tensor *a[MAXR], *b[MAXR], *g[MAXR], *s[MAXR];
} tens;

static lpx_status tens_rank(lpx_comm *c, void *ctx)
{
    tens *t = ctx;
    int r = lpx_comm_rank(c);
    lpx_status st = lpx_comm_all_gather(c, t->a[r], t->b[r]);
    if (!st) st = lpx_comm_reduce_scatter(c, t->g[r], t->s[r], LPX_REDUCE_AVG);
    if (!st) st = lpx_comm_all_reduce(c, t->s[r], LPX_REDUCE_MAX);
    if (!st) st = lpx_comm_broadcast(c, t->a[r], lpx_comm_size(c) - 1);
    return st;
}

static void test_tensor_forms(void)
{
    int n = 3;
    tens t = {0};
    int64_t sa[2] = {2, 3}, sb[2] = {6, 3}, sg[1] = {12}, ss[1] = {4};
    for (int r = 0; r < n; r++) {
        CHECK_OK(lpx_tensor_new(LPX_F8E4M3FN, 2, sa, lpx_cpu(), &t.a[r]));
        CHECK_OK(lpx_tensor_new(LPX_F8E4M3FN, 2, sb, lpx_cpu(), &t.b[r]));
        CHECK_OK(lpx_tensor_new(LPX_BF16, 1, sg, lpx_cpu(), &t.g[r]));
        CHECK_OK(lpx_tensor_new(LPX_BF16, 1, ss, lpx_cpu(), &t.s[r]));
        float fa[6], fg[12];
        for (int i = 0; i < 6; i++) fa[i] = (float)(r * 6 + i);
        for (int i = 0; i < 12; i++) fg[i] = (float)(i * (r + 1));
        lpx_convert(lpx_tensor_data(t.a[r]), LPX_F8E4M3FN, fa, LPX_F32, 6, 0);
        lpx_convert(lpx_tensor_data(t.g[r]), LPX_BF16, fg, LPX_F32, 12, 0);
    }
    unsigned char abytes[3 * 6];
    for (int r = 0; r < n; r++) memcpy(abytes + 6 * r, lpx_tensor_data(t.a[r]), 6);
    CHECK_OK(lpx_local_run(n, tens_rank, &t, 5000, NULL));
    for (int r = 0; r < n; r++) {
        float fs[4];
        CHECK(!memcmp(lpx_tensor_data(t.b[r]), abytes, sizeof abytes));  /* fp8 bytes, gathered as fp8 */
        /* avg over ranks of i*(q+1) = i*2; rank r's block is i in [4r, 4r+4); max over ranks: rank 2's */
        lpx_convert(fs, LPX_F32, lpx_tensor_data(t.s[r]), LPX_BF16, 4, 0);
        for (int i = 0; i < 4; i++) CHECKF(fs[i] == (float)((8 + i) * 2), "rank %d s[%d] = %g", r, i, fs[i]);
        CHECK(!memcmp(lpx_tensor_data(t.a[r]), abytes + 12, 6));  /* broadcast from rank 2 */
        lpx_tensor_release(t.a[r]);
        lpx_tensor_release(t.b[r]);
        lpx_tensor_release(t.g[r]);
        lpx_tensor_release(t.s[r]);
    }
}

/* ---- statistics ---------------------------------------------------- */

typedef struct statsctx {
    lpx_comm_stats s[MAXR];
    lpx_comm_stats after_reset[MAXR];
} statsctx;

static lpx_status stats_rank(lpx_comm *c, void *ctx)
{
    statsctx *sc = ctx;
    int r = lpx_comm_rank(c), n = lpx_comm_size(c);
    unsigned char send[16] = {0}, recv[16 * MAXR];
    float rs[4 * MAXR] = {0}, rr[4];
    uint16_t ar[5] = {0};
    lpx_status st = LPX_OK;
    for (int i = 0; i < 2 && !st; i++) st = lpx_comm_all_gather_buf(c, send, recv, 10);
    if (!st) st = lpx_comm_reduce_scatter_buf(c, rs, rr, 4, LPX_F32, LPX_REDUCE_SUM);
    for (int i = 0; i < 3 && !st; i++) st = lpx_comm_all_reduce_buf(c, ar, ar, 5, LPX_BF16, LPX_REDUCE_MAX);
    if (!st) st = lpx_comm_broadcast_buf(c, send, 7, n - 1);
    for (int i = 0; i < 2 && !st; i++) st = lpx_comm_barrier(c);
    if (st) return st;
    sc->s[r].struct_size = sizeof sc->s[r];
    st = lpx_comm_stats_get(c, &sc->s[r]);
    lpx_comm_stats_reset(c);
    sc->after_reset[r].struct_size = sizeof sc->after_reset[r];
    if (!st) st = lpx_comm_stats_get(c, &sc->after_reset[r]);
    return st;
}

static void test_statistics_exact(void)
{
    int n = 3;
    statsctx sc;
    memset(&sc, 0, sizeof sc);
    CHECK_OK(lpx_local_run(n, stats_rank, &sc, 5000, NULL));
    for (int r = 0; r < n; r++) {
        const lpx_comm_stats *s = &sc.s[r];
        CHECK(s->calls[LPX_COLL_ALL_GATHER] == 2 && s->bytes[LPX_COLL_ALL_GATHER] == 20);
        CHECK(s->calls[LPX_COLL_REDUCE_SCATTER] == 1 && s->bytes[LPX_COLL_REDUCE_SCATTER] == 4u * 4u * (unsigned)n);
        CHECK(s->calls[LPX_COLL_ALL_REDUCE] == 3 && s->bytes[LPX_COLL_ALL_REDUCE] == 30);
        CHECK(s->calls[LPX_COLL_BROADCAST] == 1 && s->bytes[LPX_COLL_BROADCAST] == 7);
        CHECK(s->calls[LPX_COLL_BARRIER] == 2 && s->bytes[LPX_COLL_BARRIER] == 0);
        for (int k = 0; k < LPX_COLL_COUNT; k++) {
            CHECK(s->failures[k] == 0);
            CHECK(s->ns[k] > 0);
        }
        for (int k = 0; k < LPX_COLL_MAX; k++)
            CHECK(sc.after_reset[r].calls[k] == 0 && sc.after_reset[r].bytes[k] == 0 && sc.after_reset[r].ns[k] == 0);
    }
    /* a small struct_size is refused; an older, shorter struct gets its prefix */
    lpx_comm *c[1];
    CHECK_OK(lpx_local_comm_group_create(1, c));
    lpx_comm_stats s = {.struct_size = 4};
    CHECK_ERR(lpx_comm_stats_get(c[0], &s), LPX_EINVAL);
    CHECK_OK(lpx_comm_barrier(c[0]));
    unsigned char raw[512];
    memset(raw, 0xAB, sizeof raw);
    lpx_comm_stats *shortstats = (lpx_comm_stats *)(void *)raw;
    shortstats->struct_size = offsetof(lpx_comm_stats, bytes);
    CHECK_OK(lpx_comm_stats_get(c[0], shortstats));
    CHECK(shortstats->calls[LPX_COLL_BARRIER] == 1);
    CHECK(raw[offsetof(lpx_comm_stats, bytes)] == 0xAB);  /* nothing written past struct_size */
    /* failures are counted apart */
    lpx_comm_abort(c[0], "test");
    CHECK_ERR(lpx_comm_barrier(c[0]), LPX_ECOMM);
    lpx_comm_stats s2 = {.struct_size = sizeof s2};
    CHECK_OK(lpx_comm_stats_get(c[0], &s2));
    CHECK(s2.calls[LPX_COLL_BARRIER] == 1 && s2.failures[LPX_COLL_BARRIER] == 1);
    lpx_comm_destroy(c[0]);
}

/* ---- argument errors ----------------------------------------------- */

/* Rank 0 makes the bad call `bad`, the other ranks the good all_gather. */
typedef struct badctx {
    int which;
    lpx_status st[MAXR];
    char msg[MAXR][512];
} badctx;

static lpx_status bad_rank(lpx_comm *c, void *ctx)
{
    badctx *b = ctx;
    int r = lpx_comm_rank(c);
    unsigned char send[8] = {0}, recv[8 * MAXR];
    float f[16] = {0};
    lpx_status st;
    if (r != 0) {
        st = lpx_comm_all_gather_buf(c, send, recv, 8);
    } else {
        lpx_tensor *x = NULL, *y = NULL, *v = NULL;
        int64_t s6[1] = {6}, s23[2] = {2, 3}, s5[1] = {5};
        int n = lpx_comm_size(c);
        int64_t sn[1] = {6 * (int64_t)n};
        switch (b->which) {
        case 0: st = lpx_comm_all_gather_buf(c, NULL, recv, 8); break;
        case 1: st = lpx_comm_all_gather_buf(c, recv + 1, recv, 8); break;  /* partial overlap */
        case 2: st = lpx_comm_reduce_scatter_buf(c, send, recv, 2, LPX_U8, LPX_REDUCE_SUM); break;
        case 3: st = lpx_comm_all_reduce_buf(c, f, f, 4, LPX_F32, (lpx_reduce_op)9); break;
        case 4: st = lpx_comm_broadcast_buf(c, send, 8, n); break;
        case 5: /* out too small */
            lpx_tensor_new(LPX_F32, 1, s6, lpx_cpu(), &x);
            lpx_tensor_new(LPX_F32, 1, s5, lpx_cpu(), &y);
            st = lpx_comm_all_gather(c, x, y);
            break;
        case 6: /* dtype mismatch */
            lpx_tensor_new(LPX_F32, 1, s6, lpx_cpu(), &x);
            lpx_tensor_new(LPX_BF16, 1, sn, lpx_cpu(), &y);
            st = lpx_comm_all_gather(c, x, y);
            break;
        case 7: { /* transposed view: not contiguous */
            lpx_tensor_new(LPX_F32, 2, s23, lpx_cpu(), &x);
            int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
            lpx_tensor_view_of(x, 2, shape, strides, 0, &v);
            st = lpx_comm_all_reduce(c, v, LPX_REDUCE_SUM);
            break;
        }
        case 8: st = lpx_comm_all_gather(c, NULL, NULL); break;
        default: /* reduce_scatter where in is not size * out */
            lpx_tensor_new(LPX_F32, 1, s5, lpx_cpu(), &x);
            lpx_tensor_new(LPX_F32, 1, s5, lpx_cpu(), &y);
            st = n == 1 ? LPX_ESHAPE : lpx_comm_reduce_scatter(c, x, y, LPX_REDUCE_SUM);
            if (n == 1) lpx_error(st, "reduce_scatter: n == 1 accepts equal sizes");
            break;
        }
        lpx_tensor_release(v);
        lpx_tensor_release(x);
        lpx_tensor_release(y);
    }
    b->st[r] = st;
    snprintf(b->msg[r], sizeof b->msg[r], "%s", lpx_last_error());
    return st;
}

static void test_argument_errors_abort_everyone(void)
{
    static const struct { lpx_status code; const char *coll; const char *words; } want[] = {
        {LPX_EINVAL, "all_gather #1", "send is NULL"},
        {LPX_EINVAL, "all_gather #1", "overlaps"},
        {LPX_EDTYPE, "reduce_scatter #1", "dtype u8 cannot be reduced"},
        {LPX_EINVAL, "all_reduce #1", "reduce op 9"},
        {LPX_EINVAL, "broadcast #1", "root 3"},
        {LPX_ESHAPE, "all_gather #1", "out has 5 elements"},
        {LPX_EDTYPE, "all_gather #1", "in is f32 but out is bf16"},
        {LPX_EINVAL, "all_reduce #1", "not contiguous"},
        {LPX_EINVAL, "all_gather #1", "in is NULL"},
        {LPX_ESHAPE, "reduce_scatter #1", "in has 5 elements"},
    };
    for (int which = 0; which < (int)(sizeof want / sizeof *want); which++) {
        int n = 3;
        badctx b = {.which = which};
        uint64_t t0 = lpx_now_ns();
        lpx_status st = lpx_local_run(n, bad_rank, &b, TIMEOUT_MS, NULL);
        CHECK(st == want[which].code);
        CHECKF(b.st[0] == want[which].code, "case %d: %s", which, lpx_status_string(b.st[0]));
        CHECKF(strstr(b.msg[0], want[which].coll) && strstr(b.msg[0], "(rank 0 of 3, local)") &&
               strstr(b.msg[0], want[which].words), "case %d: message '%s'", which, b.msg[0]);
        for (int r = 1; r < n; r++) {
            CHECKF(b.st[r] == LPX_ECOMM, "case %d rank %d: %s", which, r, lpx_status_string(b.st[r]));
            CHECKF(strstr(b.msg[r], "rank 0 aborted: bad argument") && strstr(b.msg[r], want[which].words),
                   "case %d rank %d: message '%s'", which, r, b.msg[r]);
        }
        CHECK(ms_since(t0) < TIMEOUT_MS);  /* told at once, not at the deadline */
    }
    CHECK_ERR(lpx_comm_all_gather_buf(NULL, NULL, NULL, 0), LPX_EINVAL);
    CHECK_ERR(lpx_comm_barrier(NULL), LPX_EINVAL);
    CHECK_ERR(lpx_local_run(0, bad_rank, NULL, 0, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_local_run(2, NULL, NULL, 0, NULL), LPX_EINVAL);
    lpx_comm *c[2];
    CHECK_ERR(lpx_local_comm_group_create(0, c), LPX_EINVAL);
    CHECK_OK(lpx_local_comm_group_create(1, c));
    CHECK_ERR(lpx_comm_set_timeout(c[0], 0), LPX_EINVAL);
    CHECK_OK(lpx_comm_set_timeout(c[0], 1234));
    CHECK(lpx_comm_timeout(c[0]) == 1234);
    CHECK(strcmp(lpx_comm_backend_name(c[0]), "local") == 0);
    lpx_comm_destroy(c[0]);
    setenv("LPX_COMM_TIMEOUT_MS", "4321", 1);
    CHECK_OK(lpx_local_comm_group_create(2, c));
    CHECK(lpx_comm_timeout(c[1]) == 4321);
    unsetenv("LPX_COMM_TIMEOUT_MS");
    lpx_comm_destroy(c[0]);
    lpx_comm_destroy(c[1]);
}

/* Rank 1 calls a different collective (or byte count) than rank 0. */
typedef struct mism {
    int which;
    lpx_status st[2];
    char msg[2][512];
} mism;

static lpx_status mism_rank(lpx_comm *c, void *ctx)
{
    mism *m = ctx;
    int r = lpx_comm_rank(c);
    unsigned char buf[64] = {0};
    float f[8] = {0};
    lpx_status st;
    if (m->which == 0) st = lpx_comm_all_gather_buf(c, buf, buf + 16, r ? 16 : 8);
    else if (m->which == 1) st = r ? lpx_comm_all_reduce_buf(c, f, f, 4, LPX_F32, LPX_REDUCE_SUM)
                                   : lpx_comm_reduce_scatter_buf(c, f, f + 4, 2, LPX_F32, LPX_REDUCE_SUM);
    else st = r ? lpx_comm_barrier(c) : lpx_comm_broadcast_buf(c, buf, 4, 0);
    m->st[r] = st;
    snprintf(m->msg[r], sizeof m->msg[r], "%s", lpx_last_error());
    return st;
}

static void test_mismatched_collectives_detected(void)
{
    for (int which = 0; which < 3; which++) {
        mism m = {.which = which};
        lpx_local_run(2, mism_rank, &m, TIMEOUT_MS, NULL);
        for (int r = 0; r < 2; r++)
            CHECKF(m.st[r] == LPX_ECOMM && strstr(m.msg[r], "mismatched collectives: rank 1 called"),
                   "case %d rank %d: %s %s", which, r, lpx_status_string(m.st[r]), m.msg[r]);
    }
}

/* ---- failure model ------------------------------------------------- */

enum { F_ABORT, F_RETURN_ERROR, F_RETURN_EARLY, F_PTHREAD_EXIT, F_STALL, F_DESTROY_EARLY };

typedef struct fault {
    int mode;
    int culprit;
    int steps;                 /* collectives every rank does before the fault */
    lpx_status st[MAXR];
    char msg[MAXR][512];
    double ms[MAXR];           /* how long the failing call took */
    lpx_status later[MAXR];    /* a call after the failure */
    char later_msg[MAXR][512];
} fault;

/* Each rank does `steps` all_reduces, then an all_gather and a barrier;
 * the culprit misbehaves right after the steps. */
static lpx_status fault_rank(lpx_comm *c, void *ctx)
{
    fault *f = ctx;
    int r = lpx_comm_rank(c), n = lpx_comm_size(c);
    float v[16];
    unsigned char g[4 * MAXR];
    for (int s = 0; s < f->steps; s++) {
        for (int i = 0; i < 16; i++) v[i] = (float)(r + s + i);
        lpx_status st = lpx_comm_all_reduce_buf(c, v, v, 16, LPX_F32, LPX_REDUCE_SUM);
        if (st) return st;
    }
    if (r == f->culprit) {
        switch (f->mode) {
        case F_ABORT:
            lpx_comm_abort(c, "injected failure");
            f->st[r] = LPX_EINTERNAL;
            return lpx_error(LPX_EINTERNAL, "rank %d gave up", r);
        case F_RETURN_ERROR:
            f->st[r] = LPX_ENUMERIC;
            return lpx_error(LPX_ENUMERIC, "injected NaN in rank %d's loss", r);
        case F_RETURN_EARLY:
            return LPX_OK;
        case F_PTHREAD_EXIT:
            pthread_exit(NULL);
        case F_STALL:
            sleep_ms(TIMEOUT_MS * 2);
            break;
        default:
            break;
        }
    }
    uint64_t t0 = lpx_now_ns();
    lpx_status st = lpx_comm_all_gather_buf(c, g + 4 * r, g, 4);
    f->ms[r] = ms_since(t0);
    f->st[r] = st;
    snprintf(f->msg[r], sizeof f->msg[r], "%s", lpx_last_error());
    f->later[r] = lpx_comm_barrier(c);
    snprintf(f->later_msg[r], sizeof f->later_msg[r], "%s", lpx_last_error());
    (void)n;
    return st ? st : f->later[r];
}

static void check_fault(fault *f, int n, const char *who, double max_ms)
{
    for (int r = 0; r < n; r++) {
        if (r == f->culprit) continue;
        CHECKF(f->st[r] == LPX_ECOMM || f->st[r] == LPX_ETIMEOUT, "mode %d n=%d rank %d: %s", f->mode, n, r,
               lpx_status_string(f->st[r]));
        CHECKF(strstr(f->msg[r], "all_gather #") && strstr(f->msg[r], who), "mode %d n=%d rank %d: '%s'",
               f->mode, n, r, f->msg[r]);
        CHECKF(f->ms[r] < max_ms, "mode %d n=%d rank %d took %.1f ms (limit %.1f)", f->mode, n, r, f->ms[r], max_ms);
        CHECKF(f->later[r] == LPX_ECOMM && strstr(f->later_msg[r], "failed earlier"), "mode %d rank %d later: '%s'",
               f->mode, r, f->later_msg[r]);
    }
}

static void test_rank_abort_fails_everyone(void)
{
    for (int w = 1; w < NWORLDS; w++) {
        int n = worlds[w];
        fault f = {.mode = F_ABORT, .culprit = n / 2, .steps = 3};
        lpx_status st[MAXR];
        lpx_status all = lpx_local_run(n, fault_rank, &f, TIMEOUT_MS, st);
        CHECK(all != LPX_OK);
        CHECK(st[f.culprit] == LPX_EINTERNAL);
        char who[64];
        snprintf(who, sizeof who, "rank %d aborted: injected failure", f.culprit);
        check_fault(&f, n, who, TIMEOUT_MS / 2.0);
    }
}

static void test_rank_error_return_fails_everyone(void)
{
    for (int w = 1; w < NWORLDS; w++) {
        int n = worlds[w];
        fault f = {.mode = F_RETURN_ERROR, .culprit = n - 1, .steps = 2};
        lpx_status st[MAXR];
        lpx_status all = lpx_local_run(n, fault_rank, &f, TIMEOUT_MS, st);
        CHECK(all == LPX_ECOMM || all == LPX_ENUMERIC);
        CHECK(st[n - 1] == LPX_ENUMERIC);
        char who[96];
        snprintf(who, sizeof who, "rank %d aborted: its function returned LPX_ENUMERIC", n - 1);
        check_fault(&f, n, who, TIMEOUT_MS / 2.0);
        CHECK(strstr(lpx_last_error(), "lpx_local_run: rank 0:") != NULL);
    }
}

static void test_rank_leaving_fails_everyone(void)
{
    for (int mode = F_RETURN_EARLY; mode <= F_PTHREAD_EXIT; mode++)
        for (int w = 1; w < NWORLDS; w++) {
            int n = worlds[w];
            fault f = {.mode = mode, .culprit = 0, .steps = 1};
            lpx_status st[MAXR];
            lpx_local_run(n, fault_rank, &f, TIMEOUT_MS, st);
            CHECK(st[0] == (mode == F_RETURN_EARLY ? LPX_OK : LPX_ECOMM));
            check_fault(&f, n, mode == F_RETURN_EARLY ? "rank 0 left (its function returned) without joining"
                                                      : "rank 0 left (its thread exited) without joining",
                        TIMEOUT_MS / 2.0);
        }
}

static void test_stalled_rank_times_out_everyone(void)
{
    for (int w = 1; w < NWORLDS; w++) {
        int n = worlds[w];
        fault f = {.mode = F_STALL, .culprit = 1, .steps = 2};
        lpx_status st[MAXR];
        uint64_t t0 = lpx_now_ns();
        lpx_local_run(n, fault_rank, &f, TIMEOUT_MS, st);
        double total = ms_since(t0);
        check_fault(&f, n, "waiting for rank 1", 2.0 * TIMEOUT_MS);
        int timed_out = 0;
        for (int r = 0; r < n; r++) {
            if (r == 1) continue;
            timed_out += f.st[r] == LPX_ETIMEOUT;
            CHECKF(f.ms[r] >= TIMEOUT_MS * 0.9 || f.st[r] == LPX_ECOMM, "rank %d returned after %.1f ms", r, f.ms[r]);
        }
        CHECK(timed_out >= 1);
        /* the stalled rank, when it comes back, is told at once */
        CHECKF(f.st[1] == LPX_ECOMM && strstr(f.msg[1], "failed earlier") && f.ms[1] < 50,
               "stalled rank: %s '%s' %.1f ms", lpx_status_string(f.st[1]), f.msg[1], f.ms[1]);
        CHECK(total < TIMEOUT_MS * 2 + 2.0 * TIMEOUT_MS);
    }
}

/* A rank stuck in its own code (never returning, never calling the comm)
 * must not hold lpx_local_run: once a peer failed, the stuck rank is
 * abandoned after a grace period and the call returns, so the process can
 * exit (fault 2 of the reliability issue; on the old code the call waited
 * for the stuck thread forever). The stuck thread is released afterwards
 * and cleans up after itself (ASan's leak check sees nothing left). */
typedef struct stuck {
    atomic_int release;        /* set by the main thread to end the stuck rank */
    atomic_int ended;          /* the stuck rank's function returned */
    lpx_status st0;
    char msg0[512];
} stuck;

static lpx_status stuck_rank(lpx_comm *c, void *ctx)
{
    stuck *s = ctx;
    if (lpx_comm_rank(c) == 1) {
        while (!atomic_load(&s->release)) sleep_ms(5);
        /* back after the run gave up on it: its comm says the group failed */
        lpx_status st = lpx_comm_barrier(c);
        atomic_store(&s->ended, 1);
        return st;
    }
    s->st0 = lpx_comm_barrier(c);
    snprintf(s->msg0, sizeof s->msg0, "%s", lpx_last_error());
    return s->st0;
}

static void test_stuck_rank_is_abandoned(void)
{
    stuck *s = calloc(1, sizeof *s); /* outlives the run: the stuck rank reads it */
    lpx_status st[2] = {LPX_OK, LPX_OK};
    uint64_t t0 = lpx_now_ns();
    lpx_status all = lpx_local_run(2, stuck_rank, s, TIMEOUT_MS, st);
    double total = ms_since(t0);
    char err[512];
    snprintf(err, sizeof err, "%s", lpx_last_error());
    CHECKF(s->st0 == LPX_ETIMEOUT && strstr(s->msg0, "waiting for rank 1"), "rank 0: %s '%s'",
           lpx_status_string(s->st0), s->msg0);
    CHECK(all == LPX_ETIMEOUT);
    CHECK(st[0] == LPX_ETIMEOUT && st[1] == LPX_ETIMEOUT);
    CHECKF(strstr(err, "lpx_local_run: rank 0:") && strstr(err, "abandoned"), "'%s'", err);
    /* the timeout, the 2 s grace, and slack for a loaded machine */
    CHECKF(total < TIMEOUT_MS + 2000 + 3000, "returned after %.0f ms", total);
    CHECK(atomic_load(&s->ended) == 0);
    atomic_store(&s->release, 1);
    for (int i = 0; i < 2000 && !atomic_load(&s->ended); i++) sleep_ms(5);
    CHECK(atomic_load(&s->ended) == 1);
    sleep_ms(100); /* lets the abandoned thread finish freeing the run */
    free(s);
}

/* Comms driven by hand (no lpx_local_run): destroying one while a peer
 * waits fails the peer at once; the group is freed with the last handle. */
typedef struct hand {
    lpx_comm *c;
    lpx_status st;
    char msg[512];
    double ms;
} hand;

static void *hand_main(void *arg)
{
    hand *h = arg;
    uint64_t t0 = lpx_now_ns();
    h->st = lpx_comm_barrier(h->c);
    h->ms = ms_since(t0);
    snprintf(h->msg, sizeof h->msg, "%s", lpx_last_error());
    return NULL;
}

static void test_destroyed_peer_fails_waiter(void)
{
    lpx_comm *c[2];
    CHECK_OK(lpx_local_comm_group_create(2, c));
    CHECK(lpx_comm_rank(c[1]) == 1 && lpx_comm_size(c[1]) == 2);
    CHECK_OK(lpx_comm_set_timeout(c[0], 5000));
    hand h = {.c = c[0]};
    pthread_t th;
    pthread_create(&th, NULL, hand_main, &h);
    sleep_ms(20);
    lpx_comm_destroy(c[1]);
    pthread_join(th, NULL);
    CHECKF(h.st == LPX_ECOMM && strstr(h.msg, "rank 1 left (destroyed its comm) without joining barrier #1"),
           "%s '%s'", lpx_status_string(h.st), h.msg);
    CHECK(h.ms < 1000);
    lpx_comm_destroy(c[0]);
}

/* ---- the reduction itself, the registry, the vtable checks, tracing -- */

static void test_reduce_buffers_semantics(void)
{
    float a[4] = {1.0f, NAN, -0.0f, 3.0f}, b[4] = {NAN, 2.0f, 0.0f, 1.0f}, c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    const void *srcs[3] = {a, b, c};
    float out[4];
    CHECK_OK(lpx_comm_reduce_buffers(out, srcs, 3, 4, LPX_F32, LPX_REDUCE_MAX));
    CHECK(isnan(out[0]) && isnan(out[1]) && out[2] == 0.5f && out[3] == 3.0f);
    CHECK_OK(lpx_comm_reduce_buffers(out, srcs, 3, 4, LPX_F32, LPX_REDUCE_MIN));
    CHECK(isnan(out[0]) && isnan(out[1]) && out[3] == 0.5f);
    float x[3] = {1.0f, 2.0f, 4.0f};
    const void *xs[3] = {x, x + 1, x + 2};
    CHECK_OK(lpx_comm_reduce_buffers(out, xs, 3, 1, LPX_F32, LPX_REDUCE_AVG));
    CHECK(out[0] == 7.0f / 3.0f);  /* a division by N, not a multiply by 1/N */
    /* in place over source 0, bf16, sum in rank order rounding once */
    uint16_t p[2], q[2];
    float pv[2] = {1.0f, 256.0f}, qv[2] = {1.0f / 128.0f, 1.0f};
    lpx_convert(p, LPX_BF16, pv, LPX_F32, 2, 0);
    lpx_convert(q, LPX_BF16, qv, LPX_F32, 2, 0);
    const void *pq[2] = {p, q};
    CHECK_OK(lpx_comm_reduce_buffers(p, pq, 2, 2, LPX_BF16, LPX_REDUCE_SUM));
    float back[2];
    lpx_convert(back, LPX_F32, p, LPX_BF16, 2, 0);
    CHECK(back[0] == 1.0f + 1.0f / 128.0f && back[1] == 256.0f);  /* 257 rounds to even 256 in bf16 */
    CHECK_ERR(lpx_comm_reduce_buffers(out, srcs, 0, 4, LPX_F32, LPX_REDUCE_SUM), LPX_EINVAL);
    CHECK_ERR(lpx_comm_reduce_buffers(out, srcs, 3, 4, LPX_I32, LPX_REDUCE_SUM), LPX_EDTYPE);
    CHECK(strcmp(lpx_reduce_op_name(LPX_REDUCE_AVG), "avg") == 0);
    CHECK(strcmp(lpx_coll_name(LPX_COLL_REDUCE_SCATTER), "reduce_scatter") == 0);
}

static lpx_status noop_rank(lpx_comm *c, void *ctx)
{
    atomic_fetch_add((atomic_int *)ctx, 1);
    return lpx_comm_barrier(c);
}

static lpx_status fake_run(const lpx_comm_backend_i *self, int nranks, int64_t timeout_ms, lpx_comm_rank_fn fn,
                           void *ctx, lpx_status *statuses)
{
    (void)self, (void)timeout_ms, (void)fn, (void)ctx, (void)statuses;
    return lpx_error(LPX_EDEVICE, "fake backend: %d ranks, no device", nranks);
}

static void test_backend_registry(void)
{
    const lpx_comm_backend_i *b = NULL;
    CHECK_OK(lpx_comm_backend_find("local", &b));
    CHECK(b && lpx_comm_backend_at(0) == b && lpx_comm_backend_count() >= 1);
    CHECK_ERR(lpx_comm_backend_find("nccl-nope", &b), LPX_ENOTFOUND);
    CHECK(strstr(lpx_last_error(), "registered: local") != NULL);
    atomic_int calls = 0;
    lpx_status st[4];
    CHECK_OK(lpx_comm_run("local", 4, TIMEOUT_MS, noop_rank, &calls, st));
    CHECK(atomic_load(&calls) == 4 && st[3] == LPX_OK);
    lpx_comm_backend_i fake = {.struct_size = sizeof fake, .name = "fake", .description = "test", .run = fake_run};
    int before = lpx_comm_backend_count();
    CHECK_OK(lpx_comm_backend_register(&fake));
    CHECK_ERR(lpx_comm_backend_register(&fake), LPX_EEXIST);
    lpx_comm_backend_i dup_local = fake;
    dup_local.name = "local";
    CHECK_ERR(lpx_comm_backend_register(&dup_local), LPX_EEXIST);
    fake.run = NULL;
    fake.name = "fake2";
    CHECK_ERR(lpx_comm_backend_register(&fake), LPX_EINVAL);
    CHECK(lpx_comm_backend_count() == before + 1);
    CHECK_ERR(lpx_comm_run("fake", 2, 0, noop_rank, NULL, NULL), LPX_EDEVICE);
}

static int v_rank(void *s) { (void)s; return 0; }
static int v_size(void *s) { (void)s; return 1; }
static lpx_status v_coll(void *s, const lpx_comm_args *a) { (void)s, (void)a; return LPX_OK; }
static void v_abort(void *s, const char *r) { (void)s, (void)r; }
static void v_destroy(void *s) { (void)s; }

static void test_comm_new_checks_vtable(void)
{
    lpx_comm_i vt = {.struct_size = sizeof vt, .abi_version = LPX_COMM_ABI_VERSION, .name = "v",
                     .rank = v_rank, .size = v_size, .all_gather = v_coll, .reduce_scatter = v_coll,
                     .all_reduce = v_coll, .broadcast = v_coll, .barrier = v_coll, .abort = v_abort,
                     .destroy = v_destroy};
    lpx_comm *c = NULL;
    static int state;
    CHECK_OK(lpx_comm_new(&vt, &state, &c));
    CHECK(lpx_comm_size(c) == 1);
    /* the backend finds its state again; another backend's vtable does not */
    CHECK(lpx_comm_backend_state(c, &vt) == &state);
    lpx_comm *lc[1] = {NULL};
    CHECK_OK(lpx_local_comm_group_create(1, lc));
    CHECK(lpx_comm_backend_state(lc[0], &vt) == NULL && lpx_comm_backend_state(c, NULL) == NULL &&
          lpx_comm_backend_state(NULL, &vt) == NULL);
    lpx_comm_destroy(lc[0]);
    lpx_comm_destroy(c);
    lpx_comm_i bad = vt;
    bad.abi_version = 99;
    CHECK_ERR(lpx_comm_new(&bad, NULL, &c), LPX_EABI);
    bad = vt;
    bad.reduce_scatter = NULL;
    CHECK_ERR(lpx_comm_new(&bad, NULL, &c), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "reduce_scatter") != NULL);
    bad = vt;
    bad.struct_size = 8;
    CHECK_ERR(lpx_comm_new(&bad, NULL, &c), LPX_EINVAL);
}

static lpx_status traced_rank(lpx_comm *c, void *ctx)
{
    (void)ctx;
    unsigned char s[4] = {0}, r[16];
    lpx_status st = lpx_comm_all_gather_buf(c, s, r, 4);
    return st ? st : lpx_comm_barrier(c);
}

static void test_trace_spans(void)
{
    char path[] = "/tmp/lpx_test_comm_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(lpx_trace_start(path));
    CHECK_OK(lpx_local_run(2, traced_rank, NULL, TIMEOUT_MS, NULL));
    CHECK_OK(lpx_trace_stop());
    FILE *f = fopen(path, "r");
    char buf[65536];
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[len] = 0;
    if (f) fclose(f);
    CHECK(strstr(buf, "\"all_gather\"") && strstr(buf, "\"barrier\"") && strstr(buf, "\"comm\""));
    remove(path);
}

int main(void)
{
    RUN(test_all_gather_is_concatenation);
    RUN(test_reduce_scatter_is_reduce_then_shard);
    RUN(test_all_reduce_matches_reference);
    RUN(test_fp8_reductions_match_reference);
    RUN(test_fp8_reduction_saturates);
    RUN(test_broadcast_from_every_root);
    RUN(test_bit_reproducible_across_runs);
    RUN(test_mixed_dtypes_in_one_buffer);
    RUN(test_tensor_forms);
    RUN(test_statistics_exact);
    RUN(test_argument_errors_abort_everyone);
    RUN(test_mismatched_collectives_detected);
    RUN(test_rank_abort_fails_everyone);
    RUN(test_rank_error_return_fails_everyone);
    RUN(test_rank_leaving_fails_everyone);
    RUN(test_stalled_rank_times_out_everyone);
    RUN(test_stuck_rank_is_abandoned);
    RUN(test_destroyed_peer_fails_waiter);
    RUN(test_reduce_buffers_semantics);
    RUN(test_backend_registry);
    RUN(test_comm_new_checks_vtable);
    RUN(test_trace_spans);
    return CHECK_DONE();
}
