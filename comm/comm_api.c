/* The validated collective calls: check arguments (naming the collective,
 * the rank and the bad argument), fill an lpx_comm_args, call the backend
 * slot under the comm's deadline, count statistics and record a trace span.
 *
 * An argument error aborts the comm before returning: the peers are (or
 * will be) waiting inside the same collective, and telling them now turns a
 * timeout into an immediate error that names the culprit. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "comm_internal.h"

typedef lpx_status (*slot_fn)(void *self, const lpx_comm_args *a);

#define MSG 768

/* Reports an argument error of this rank: aborts the comm with the reason
 * and returns `st` with "<coll> #<seq> (rank R of N, backend): why". */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 4, 5)))
#endif
static lpx_status bad_arg(lpx_comm *c, lpx_coll k, lpx_status st, const char *fmt, ...)
{
    char why[MSG], reason[MSG + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    uint64_t seq = c->seq + 1;  /* the call that never started */
    snprintf(reason, sizeof reason, "bad argument to %s #%" PRIu64 ": %s", lpx_coll_name(k), seq, why);
    c->vt.abort(c->self, reason);
    atomic_fetch_add_explicit(&c->failures[k], 1, memory_order_relaxed);
    return lpx_error(st, "%s #%" PRIu64 " (rank %d of %d, %s): %s", lpx_coll_name(k), seq, c->rank,
                     c->size, c->vt.name, why);
}

/* Calls the slot with the deadline set, then accounts for the call.
 * `payload` is the statistics byte count of a successful call. */
static lpx_status run(lpx_comm *c, lpx_comm_args *a, slot_fn slot, uint64_t payload)
{
    a->struct_size = sizeof *a;
    a->seq = ++c->seq;
    a->timeout_ms = (int64_t)atomic_load_explicit(&c->timeout_ms, memory_order_relaxed);
    uint64_t t0 = lpx_now_ns();
    a->deadline_ns = t0 + (uint64_t)a->timeout_ms * UINT64_C(1000000);
    lpx_clear_error();
    lpx_status st = slot(c->self, a);
    uint64_t t1 = lpx_now_ns();
    lpx_coll k = a->kind;
    atomic_fetch_add_explicit(&c->ns[k], t1 - t0, memory_order_relaxed);
    if (st == LPX_OK) {
        atomic_fetch_add_explicit(&c->calls[k], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->bytes[k], payload, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&c->failures[k], 1, memory_order_relaxed);
        char why[MSG];
        snprintf(why, sizeof why, "%s", lpx_last_error()[0] ? lpx_last_error() : lpx_status_string(st));
        lpx_error(st, "%s #%" PRIu64 " (rank %d of %d, %s): %s", lpx_coll_name(k), a->seq, c->rank,
                  c->size, c->vt.name, why);
    }
    lpx_trace_span(lpx_coll_name(k), "comm", t0, t1);
    return st;
}

static bool overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* n * m without overflow, or false. */
static bool mul_ok(size_t n, size_t m, size_t *out)
{
    if (m && n > SIZE_MAX / m) return false;
    *out = n * m;
    return true;
}

static lpx_status check_reduce(lpx_comm *c, lpx_coll k, lpx_dtype dtype, lpx_reduce_op op)
{
    if ((unsigned)op >= LPX_REDUCE_OP_COUNT)
        return bad_arg(c, k, LPX_EINVAL, "reduce op %d is not sum, avg, max or min", (int)op);
    if (!lpx__comm_reduce_dtype_ok(dtype))
        return bad_arg(c, k, LPX_EDTYPE, "dtype %s cannot be reduced (f32, bf16, f16, f8e4m3fn, f8e5m2 can)",
                       lpx_dtype_name(dtype));
    return LPX_OK;
}

/* ---- buffer forms -------------------------------------------------- */

static lpx_status all_gather_buf(lpx_comm *c, const void *send, void *recv, size_t nbytes,
                                 lpx_dtype dtype, size_t count, lpx_device dev)
{
    const lpx_coll k = LPX_COLL_ALL_GATHER;
    size_t total = 0;
    if (!mul_ok(nbytes, (size_t)c->size, &total))
        return bad_arg(c, k, LPX_ERANGE, "%zu bytes x %d ranks overflows size_t", nbytes, c->size);
    if (nbytes && (!send || !recv))
        return bad_arg(c, k, LPX_EINVAL, "%s is NULL", send ? "recv" : "send");
    const unsigned char *mine = recv ? (const unsigned char *)recv + (size_t)c->rank * nbytes : NULL;
    if (send != mine && overlaps(send, nbytes, recv, total))
        return bad_arg(c, k, LPX_EINVAL, "send overlaps recv (in place means send == recv + rank * %zu)",
                       nbytes);
    lpx_comm_args a = {.kind = k, .send = send, .recv = recv, .count = count, .nbytes = nbytes,
                       .dtype = dtype, .root = 0, .device = dev};
    return run(c, &a, c->vt.all_gather, nbytes);
}

lpx_status lpx_comm_all_gather_buf(lpx_comm *comm, const void *send, void *recv, size_t nbytes)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_all_gather_buf: comm is NULL");
    return all_gather_buf(comm, send, recv, nbytes, LPX_U8, nbytes, lpx_cpu());
}

static lpx_status reduce_scatter_buf(lpx_comm *c, const void *send, void *recv, size_t count,
                                     lpx_dtype dtype, lpx_reduce_op op, lpx_device dev)
{
    const lpx_coll k = LPX_COLL_REDUCE_SCATTER;
    lpx_status st = check_reduce(c, k, dtype, op);
    if (st) return st;
    size_t block = 0, total = 0;
    if (!mul_ok(count, lpx_dtype_nbytes(dtype, 1), &block) || !mul_ok(block, (size_t)c->size, &total))
        return bad_arg(c, k, LPX_ERANGE, "%zu elements x %d ranks overflows size_t", count, c->size);
    if (count && (!send || !recv))
        return bad_arg(c, k, LPX_EINVAL, "%s is NULL", send ? "recv" : "send");
    const unsigned char *mine = send ? (const unsigned char *)send + (size_t)c->rank * block : NULL;
    if ((const void *)mine != recv && overlaps(send, total, recv, block))
        return bad_arg(c, k, LPX_EINVAL, "recv overlaps send (in place means recv == send + rank * %zu)",
                       block);
    lpx_comm_args a = {.kind = k, .send = send, .recv = recv, .count = count, .nbytes = block,
                       .dtype = dtype, .op = op, .device = dev};
    return run(c, &a, c->vt.reduce_scatter, total);
}

lpx_status lpx_comm_reduce_scatter_buf(lpx_comm *comm, const void *send, void *recv, size_t count,
                                       lpx_dtype dtype, lpx_reduce_op op)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_reduce_scatter_buf: comm is NULL");
    return reduce_scatter_buf(comm, send, recv, count, dtype, op, lpx_cpu());
}

static lpx_status all_reduce_buf(lpx_comm *c, const void *send, void *recv, size_t count,
                                 lpx_dtype dtype, lpx_reduce_op op, lpx_device dev)
{
    const lpx_coll k = LPX_COLL_ALL_REDUCE;
    lpx_status st = check_reduce(c, k, dtype, op);
    if (st) return st;
    size_t bytes = 0;
    if (!mul_ok(count, lpx_dtype_nbytes(dtype, 1), &bytes))
        return bad_arg(c, k, LPX_ERANGE, "%zu elements overflow size_t", count);
    if (count && (!send || !recv))
        return bad_arg(c, k, LPX_EINVAL, "%s is NULL", send ? "recv" : "send");
    if (send != recv && overlaps(send, bytes, recv, bytes))
        return bad_arg(c, k, LPX_EINVAL, "send and recv overlap without being equal");
    lpx_comm_args a = {.kind = k, .send = send, .recv = recv, .count = count, .nbytes = bytes,
                       .dtype = dtype, .op = op, .device = dev};
    return run(c, &a, c->vt.all_reduce, bytes);
}

lpx_status lpx_comm_all_reduce_buf(lpx_comm *comm, const void *send, void *recv, size_t count,
                                   lpx_dtype dtype, lpx_reduce_op op)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_all_reduce_buf: comm is NULL");
    return all_reduce_buf(comm, send, recv, count, dtype, op, lpx_cpu());
}

static lpx_status broadcast_buf(lpx_comm *c, void *buf, size_t nbytes, int root, lpx_dtype dtype,
                                size_t count, lpx_device dev)
{
    const lpx_coll k = LPX_COLL_BROADCAST;
    if (root < 0 || root >= c->size)
        return bad_arg(c, k, LPX_EINVAL, "root %d is not a rank of 0..%d", root, c->size - 1);
    if (nbytes && !buf) return bad_arg(c, k, LPX_EINVAL, "buf is NULL");
    lpx_comm_args a = {.kind = k, .send = buf, .recv = buf, .count = count, .nbytes = nbytes,
                       .dtype = dtype, .root = root, .device = dev};
    return run(c, &a, c->vt.broadcast, nbytes);
}

lpx_status lpx_comm_broadcast_buf(lpx_comm *comm, void *buf, size_t nbytes, int root)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_broadcast_buf: comm is NULL");
    return broadcast_buf(comm, buf, nbytes, root, LPX_U8, nbytes, lpx_cpu());
}

lpx_status lpx_comm_barrier(lpx_comm *comm)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_barrier: comm is NULL");
    lpx_comm_args a = {.kind = LPX_COLL_BARRIER, .dtype = LPX_U8, .device = lpx_cpu()};
    return run(comm, &a, comm->vt.barrier, 0);
}

/* ---- tensor forms -------------------------------------------------- */

/* A tensor a collective can read or write as one byte range. */
static lpx_status check_tensor(lpx_comm *c, lpx_coll k, const char *what, const lpx_tensor *t)
{
    if (!t) return bad_arg(c, k, LPX_EINVAL, "%s is NULL", what);
    if (lpx_tensor_kind(t))
        return bad_arg(c, k, LPX_EINVAL, "%s is a %s tensor; collectives move dense buffers "
                       "(gather what its kind's pre_all_gather returns)", what,
                       lpx_kind_name(lpx_tensor_kind(t)));
    if (!lpx_tensor_is_contiguous(t)) {
        char shape[128];
        return bad_arg(c, k, LPX_EINVAL, "%s (shape %s) is not contiguous", what,
                       lpx_tensor_shape_str(t, shape, sizeof shape));
    }
    return LPX_OK;
}

/* Bytes of n elements of d, refusing a packed dtype cut mid-byte. */
static lpx_status whole_bytes(lpx_comm *c, lpx_coll k, const char *what, lpx_dtype d, int64_t n,
                              size_t *out)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(d);
    if (!tr) return bad_arg(c, k, LPX_EDTYPE, "%s has unknown dtype %d", what, (int)d);
    if (((uint64_t)n * (uint64_t)tr->bits) % 8)
        return bad_arg(c, k, LPX_ESHAPE, "%s: %" PRId64 " elements of %s do not fill whole bytes",
                       what, n, tr->name);
    *out = (size_t)((uint64_t)n * (uint64_t)tr->bits / 8);
    return LPX_OK;
}

/* The checks an in -> out collective makes on its two tensors: both valid,
 * on one device, of one dtype. */
static lpx_status check_in_out(lpx_comm *c, lpx_coll k, const lpx_tensor *in, const lpx_tensor *out)
{
    lpx_status st = check_tensor(c, k, "in", in);
    if (!st) st = check_tensor(c, k, "out", out);
    if (st) return st;
    lpx_device x = lpx_tensor_device(in), y = lpx_tensor_device(out);
    if (x.type != y.type || x.index != y.index)
        return bad_arg(c, k, LPX_EDEVICE, "in is on device %d:%d, out on %d:%d", x.type, x.index,
                       y.type, y.index);
    if (lpx_tensor_dtype(out) != lpx_tensor_dtype(in))
        return bad_arg(c, k, LPX_EDTYPE, "in is %s but out is %s", lpx_dtype_name(lpx_tensor_dtype(in)),
                       lpx_dtype_name(lpx_tensor_dtype(out)));
    return LPX_OK;
}

lpx_status lpx_comm_all_gather(lpx_comm *comm, const lpx_tensor *in, lpx_tensor *out)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_all_gather: comm is NULL");
    const lpx_coll k = LPX_COLL_ALL_GATHER;
    lpx_status st = check_in_out(comm, k, in, out);
    if (st) return st;
    lpx_dtype d = lpx_tensor_dtype(in);
    int64_t n = lpx_tensor_numel(in), m = lpx_tensor_numel(out);
    if (m / comm->size != n || m % comm->size)
        return bad_arg(comm, k, LPX_ESHAPE, "out has %" PRId64 " elements, expected %d ranks x %" PRId64
                       " = %" PRId64, m, comm->size, n, n * comm->size);
    size_t nbytes = 0;
    if ((st = whole_bytes(comm, k, "in", d, n, &nbytes))) return st;
    return all_gather_buf(comm, lpx_tensor_data(in), lpx_tensor_data(out), nbytes, d, (size_t)n,
                          lpx_tensor_device(in));
}

lpx_status lpx_comm_reduce_scatter(lpx_comm *comm, const lpx_tensor *in, lpx_tensor *out,
                                   lpx_reduce_op op)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_reduce_scatter: comm is NULL");
    const lpx_coll k = LPX_COLL_REDUCE_SCATTER;
    lpx_status st = check_in_out(comm, k, in, out);
    if (st) return st;
    lpx_dtype d = lpx_tensor_dtype(in);
    int64_t n = lpx_tensor_numel(in), m = lpx_tensor_numel(out);
    if (n / comm->size != m || n % comm->size)
        return bad_arg(comm, k, LPX_ESHAPE, "in has %" PRId64 " elements, expected %d ranks x %" PRId64
                       " (out) = %" PRId64, n, comm->size, m, m * comm->size);
    return reduce_scatter_buf(comm, lpx_tensor_data(in), lpx_tensor_data(out), (size_t)m, d, op,
                              lpx_tensor_device(in));
}

lpx_status lpx_comm_all_reduce(lpx_comm *comm, lpx_tensor *t, lpx_reduce_op op)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_all_reduce: comm is NULL");
    lpx_status st = check_tensor(comm, LPX_COLL_ALL_REDUCE, "t", t);
    if (st) return st;
    void *p = lpx_tensor_data(t);
    return all_reduce_buf(comm, p, p, (size_t)lpx_tensor_numel(t), lpx_tensor_dtype(t), op,
                          lpx_tensor_device(t));
}

lpx_status lpx_comm_broadcast(lpx_comm *comm, lpx_tensor *t, int root)
{
    if (!comm) return lpx_error(LPX_EINVAL, "lpx_comm_broadcast: comm is NULL");
    const lpx_coll k = LPX_COLL_BROADCAST;
    lpx_status st = check_tensor(comm, k, "t", t);
    if (st) return st;
    size_t nbytes = 0;
    int64_t n = lpx_tensor_numel(t);
    if ((st = whole_bytes(comm, k, "t", lpx_tensor_dtype(t), n, &nbytes))) return st;
    return broadcast_buf(comm, lpx_tensor_data(t), nbytes, root, lpx_tensor_dtype(t), (size_t)n,
                         lpx_tensor_device(t));
}
