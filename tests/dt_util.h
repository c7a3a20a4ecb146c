/* Helpers shared by test_dtensor.c and the test_fsdp_*.c programs: running N local ranks
 * and comparing tensors bit for bit. Rank functions never use CHECK (its
 * counters are not thread-safe): they record the first failure in their
 * rank_result and the main thread checks. */
#ifndef LPX_TESTS_DT_UTIL_H
#define LPX_TESTS_DT_UTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "lpx/lpx.h"

#define MAXR 8
static const int worlds[] = {1, 2, 3, 4, 8};
#define NWORLDS (int)(sizeof worlds / sizeof worlds[0])

typedef struct rank_result {
    int fails;
    char msg[512];
} rank_result;

static rank_result results[MAXR];

static void rfail(int rank, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void rfail(int rank, const char *fmt, ...)
{
    if (results[rank].fails++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(results[rank].msg, sizeof results[rank].msg, fmt, ap);
    va_end(ap);
}

#define RCHECK(rank, cond) do { if (!(cond)) rfail(rank, "%s:%d: %s", __FILE__, __LINE__, #cond); } while (0)
#define RCHECK_OK(rank, expr) do { lpx_status s_ = (expr); if (s_) rfail(rank, "%s:%d: %s -> %s (%s)", __FILE__, \
    __LINE__, #expr, lpx_status_string(s_), lpx_last_error()); } while (0)

/* Runs fn on n ranks; checks every rank succeeded and recorded nothing. */
static inline void run_ranks(int n, lpx_comm_rank_fn fn, void *ctx)
{
    memset(results, 0, sizeof results);
    lpx_status sts[MAXR];
    lpx_status st = lpx_local_run(n, fn, ctx, 20000, sts);
    CHECKF(st == LPX_OK, "world %d: %s (%s)", n, lpx_status_string(st), lpx_last_error());
    for (int r = 0; r < n; r++) CHECKF(results[r].fails == 0, "world %d rank %d: %s", n, r, results[r].msg);
}

/* Bitwise equality of dense tensors (same dtype/shape; contiguous copies
 * compared), or of kind tensors through their inner tensors. */
static inline bool same_bits(lpx_tensor *a, lpx_tensor *b)
{
    if (!a || !b || lpx_tensor_kind(a) != lpx_tensor_kind(b) || lpx_tensor_dtype(a) != lpx_tensor_dtype(b) ||
        lpx_tensor_ndim(a) != lpx_tensor_ndim(b) ||
        memcmp(lpx_tensor_shape(a), lpx_tensor_shape(b), (size_t)lpx_tensor_ndim(a) * sizeof(int64_t)))
        return false;
    if (lpx_tensor_kind(a)) {
        if (lpx_tensor_inner_count(a) != lpx_tensor_inner_count(b)) return false;
        for (int i = 0; i < lpx_tensor_inner_count(a); i++)
            if (!same_bits(lpx_tensor_inner(a, i), lpx_tensor_inner(b, i))) return false;
        return true;
    }
    lpx_tensor *ca = NULL, *cb = NULL;
    if (lpx_contiguous(a, &ca) || lpx_contiguous(b, &cb)) {
        lpx_tensor_release(ca);
        lpx_tensor_release(cb);
        return false;
    }
    size_t nb = lpx_dtype_nbytes(lpx_tensor_dtype(a), lpx_tensor_numel(a));
    bool ok = !nb || !memcmp(lpx_tensor_data(ca), lpx_tensor_data(cb), nb);
    lpx_tensor_release(ca);
    lpx_tensor_release(cb);
    return ok;
}

static inline double max_abs_diff(lpx_tensor *a, lpx_tensor *b)
{
    lpx_tensor *d = NULL, *m = NULL, *fa = NULL, *fb = NULL;
    double v = 1e30;
    if (!lpx_kind_to_dense(a, &fa) && !lpx_kind_to_dense(b, &fb) && !lpx_sub(fa, fb, &d) &&
        !lpx_amax(d, 0, NULL, false, &m))
        lpx_item(m, 0, &v);
    lpx_tensor_release(d);
    lpx_tensor_release(m);
    lpx_tensor_release(fa);
    lpx_tensor_release(fb);
    return v;
}

/* A sharding engine over a 1-D mesh of comm (cfg may be NULL). */
static inline lpx_status new_engine(lpx_comm *comm, const lpx_fsdp_config *cfg, lpx_fsdp **f)
{
    lpx_mesh *mesh = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (st) return st;
    st = lpx_fsdp_new(mesh, cfg, f);
    lpx_mesh_release(mesh); /* the engine holds it */
    return st;
}

#endif
