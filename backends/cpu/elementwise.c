/* CPU kernels: elementwise ops (add, sub, mul, div and swiglu with numpy
 * broadcasting, add_scalar, mul_scalar, neg, abs, sqrt, exp, relu, silu,
 * gelu, their backward ops, swiglu_backward, cast, copy_, fill_).
 *
 * Arithmetic is done in f32 whatever the storage dtype; the result has the
 * first input's dtype and is encoded with RNE (non-saturating).
 *
 * The arguments come checked and normalised by the dispatcher (spec
 * families `binary`, `unary`, `cast`, `copy`, `fill`: op_args.h,
 * op_args_elementwise.h); their kernels hold arithmetic only.
 *
 * Two paths per op:
 *  - fast: every operand a dense, contiguous CPU f32 tensor of the same
 *    shape (the family's `flat`, and `out`, when given, not partially
 *    overlapping an input). The loop runs straight over the float
 *    pointers: this is what a dispatched small add_out costs.
 *  - generic: broadcasting, any byte-sized dtype and layout, in chunks of
 *    CPU_CHUNK through cpu_load_f32 / cpu_store_f32 (skipped for operands
 *    that are contiguous f32).
 * An `out` that overlaps an input without having exactly its layout
 * (e.g. a shifted view of the same storage) gets a private f32 copy of
 * that input first, so results never depend on the chunk order. */
#include <math.h>
#include <string.h>
#include "cpu_internal.h"
#include "../../core/numerics/activations.h"

#define CPU_ONLY_KEYS (UINT64_C(1) << LPX_KEY_CPU)
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* the op codes, from the families' op lists (op_args*.h) */
#define B_CODE(op, N) B_##N,
#define U_CODE(op, N) U_##N,
typedef enum bop { LPX_BINARY_OPS(B_CODE) } bop;
typedef enum uop { LPX_UNARY_OPS(U_CODE) } uop;

/* ---- scalar math (f32): core/numerics/activations.h, shared with CUDA -- */

/* One loop per op (the switch sits outside the loops, so each loop is a
 * plain vectorizable body). No restrict: o may alias a or b exactly. */
static ALWAYS_INLINE void bin_loop(bop op, float *o, const float *a, const float *b, int64_t n)
{
    switch (op) {
    case B_ADD: for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i]; break;
    case B_SUB: for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i]; break;
    case B_MUL: for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i]; break;
    case B_DIV: for (int64_t i = 0; i < n; i++) o[i] = a[i] / b[i]; break;
    case B_RELU_BW: for (int64_t i = 0; i < n; i++) o[i] = b[i] > 0.0f ? a[i] : 0.0f; break;
    case B_SILU_BW: for (int64_t i = 0; i < n; i++) o[i] = a[i] * lpx_silu_grad(b[i]); break;
    case B_GELU_BW: for (int64_t i = 0; i < n; i++) o[i] = a[i] * lpx_gelu_grad(b[i]); break;
    case B_SWIGLU: for (int64_t i = 0; i < n; i++) o[i] = lpx_swiglu_f(a[i], b[i]); break;
    }
}

static ALWAYS_INLINE void un_loop(uop op, float *o, const float *x, float s, int64_t n)
{
    switch (op) {
    case U_NEG: for (int64_t i = 0; i < n; i++) o[i] = -x[i]; break;
    case U_ABS: for (int64_t i = 0; i < n; i++) o[i] = fabsf(x[i]); break;
    case U_SQRT: for (int64_t i = 0; i < n; i++) o[i] = sqrtf(x[i]); break;
    case U_EXP: for (int64_t i = 0; i < n; i++) o[i] = expf(x[i]); break;
    /* x > 0 ? x : 0 would turn NaN into 0; torch keeps NaN */
    case U_RELU: for (int64_t i = 0; i < n; i++) o[i] = x[i] < 0.0f ? 0.0f : x[i]; break;
    case U_SILU: for (int64_t i = 0; i < n; i++) o[i] = lpx_silu_f(x[i]); break;
    case U_GELU: for (int64_t i = 0; i < n; i++) o[i] = lpx_gelu_f(x[i]); break;
    case U_ADDS: for (int64_t i = 0; i < n; i++) o[i] = x[i] + s; break;
    case U_MULS: for (int64_t i = 0; i < n; i++) o[i] = x[i] * s; break;
    }
}

/* ---- fast-path tests ------------------------------------------------- */

static ALWAYS_INLINE bool same_shape(const lpx_tensor *a, const lpx_tensor *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static ALWAYS_INLINE float *f32_data(const lpx_tensor *t)
{
    return (float *)t->storage->data + t->offset;
}

/* o and x (n floats each) are the same range or disjoint */
static ALWAYS_INLINE bool same_or_disjoint(const float *o, const float *x, int64_t n)
{
    return o == x || o + n <= x || x + n <= o;
}

/* ---- overlap handling for the generic path --------------------------- */

/* Byte range [lo, hi) that a dense tensor's elements can touch. */
static void byte_range(const lpx_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    int64_t span = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) { span = 0; break; }
        span += (t->shape[i] - 1) * t->strides[i];
    }
    *lo = (uintptr_t)lpx_tensor_data(t);
    *hi = *lo + (uintptr_t)span * (uintptr_t)(lpx_dtype_get(t->dtype)->bits / 8);
}

static bool may_overlap(const lpx_tensor *a, const lpx_tensor *b)
{
    uintptr_t alo, ahi, blo, bhi;
    byte_range(a, &alo, &ahi);
    byte_range(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

/* Same dtype, address, shape and strides (size-1 dims ignored): reading x
 * and writing o element by element is then safe in any order. */
static bool same_layout(const lpx_tensor *o, const lpx_tensor *x)
{
    if (o->dtype != x->dtype || !same_shape(o, x) || lpx_tensor_data(o) != lpx_tensor_data(x)) return false;
    for (int i = 0; i < o->ndim; i++)
        if (o->shape[i] > 1 && o->strides[i] != x->strides[i]) return false;
    return true;
}

/* A private contiguous f32 copy of x when it overlaps `out` in a way an
 * in-place loop cannot handle; *copy stays NULL otherwise. */
static lpx_status unalias(const lpx_call *c, const lpx_tensor *out, const lpx_tensor *x, lpx_tensor **copy)
{
    *copy = NULL;
    if (!out || !may_overlap(out, x) || same_layout(out, x)) return LPX_OK;
    lpx_status st = cpu_new(c, LPX_F32, x->ndim, x->shape, copy);
    if (st) return st;
    cpu_view v;
    cpu_view_of(&v, x);
    cpu_load_f32(&v, 0, v.numel, f32_data(*copy));
    return LPX_OK;
}

/* ---- binary ops ------------------------------------------------------- */

static void bin_run(bop op, const cpu_view *va, const cpu_view *vb, const cpu_view *vo)
{
    float ta[CPU_CHUNK], tb[CPU_CHUNK];
    const float *fa = cpu_view_f32(va), *fb = cpu_view_f32(vb);
    float *fo = cpu_view_f32(vo);
    for (int64_t start = 0; start < vo->numel; start += CPU_CHUNK) {
        int64_t m = vo->numel - start < CPU_CHUNK ? vo->numel - start : CPU_CHUNK;
        const float *pa = fa ? fa + start : ta, *pb = fb ? fb + start : tb;
        if (!fa) cpu_load_f32(va, start, m, ta);
        if (!fb) cpu_load_f32(vb, start, m, tb);
        float *po = fo ? fo + start : ta;
        bin_loop(op, po, pa, pb, m);
        if (!fo) cpu_store_f32(vo, start, m, ta, 0);
    }
}

/* The generic path: broadcasting, any byte-sized dtype and layout. */
static lpx_status binary_slow(lpx_call *c, bop op, const lpx_binary_args *g)
{
    lpx_tensor *a = g->a, *b = g->b, *out = g->out;
    int nd = g->ndim;
    const int64_t *shape = g->shape;
    lpx_status st;
    lpx_tensor *res, *ca = NULL, *cb = NULL;
    if (out) {
        lpx_tensor_retain(out);
        res = out;
    } else if ((st = cpu_new(c, g->dtype, nd, shape, &res))) {
        return st;
    }
    if ((st = unalias(c, out, a, &ca)) || (st = unalias(c, out, b, &cb))) {
        lpx_tensor_release(ca);
        lpx_tensor_release(res);
        return st;
    }
    cpu_view va, vb, vo;
    cpu_view_init(&va, ca ? ca : a, nd, shape);
    cpu_view_init(&vb, cb ? cb : b, nd, shape);
    cpu_view_of(&vo, res);
    bin_run(op, &va, &vb, &vo);
    lpx_tensor_release(ca);
    lpx_tensor_release(cb);
    cpu_ret(c, res);
    return LPX_OK;
}

/* The fast-path test on the dispatcher's checked arguments: its `flat`
 * says one shape and contiguous (out, when given, has a's dtype), so what
 * is left is the CPU's: every operand a plain CPU tensor, f32 (LPX_F32 is
 * 0: one OR of the dtypes). */
_Static_assert(LPX_F32 == 0, "the fast-path dtype test ORs dtypes against LPX_F32 == 0");
static ALWAYS_INLINE bool fast2(const lpx_binary_args *g)
{
    const lpx_tensor *a = g->a, *b = g->b, *r = g->out ? g->out : g->a;
    return g->flat & ((a->keys | b->keys | r->keys) == CPU_ONLY_KEYS) & ((a->dtype | b->dtype) == LPX_F32);
}

/* Everything but "out given and fast": a new result on the fast path, or
 * the generic path. Kept out of line so the hot case stays a small leaf. */
static __attribute__((noinline)) lpx_status binary_rest(lpx_call *c, bop op, const lpx_binary_args *g)
{
    lpx_tensor *a = g->a, *b = g->b;
    if (!g->out && fast2(g)) {
        lpx_tensor *r;
        lpx_status st = cpu_new(c, LPX_F32, a->ndim, a->shape, &r);
        if (st) return st;
        bin_loop(op, f32_data(r), f32_data(a), f32_data(b), a->numel);
        cpu_ret(c, r);
        return LPX_OK;
    }
    return binary_slow(c, op, g);
}

/* The contract (dense operands, broadcasting, the result's shape and
 * dtype, a valid `out`) is the dispatcher's: spec family `binary`. */
static ALWAYS_INLINE lpx_status binary(lpx_call *c, bop op)
{
    const lpx_binary_args *g = lpx_op_args_of(c);
    lpx_tensor *a = g->a, *b = g->b, *o = g->out;
    if (o && LPX_LIKELY(fast2(g))) {
        int64_t n = a->numel;
        const float *pa = f32_data(a), *pb = f32_data(b);
        float *po = f32_data(o);
        if (LPX_LIKELY(same_or_disjoint(po, pa, n) && same_or_disjoint(po, pb, n))) {
            bin_loop(op, po, pa, pb, n);
            /* the result is a new reference to out (inline retain) */
            atomic_fetch_add_explicit(&o->refcount, 1, memory_order_relaxed);
            cpu_ret(c, o);
            return LPX_OK;
        }
    }
    return binary_rest(c, op, g);
}

#define K_BINARY(op, N) static lpx_status k_##op(lpx_call *c) { return binary(c, B_##N); }
LPX_BINARY_OPS(K_BINARY)

/* ---- swiglu_backward ---------------------------------------------------
 * Three inputs of one shape (the contract is the dispatcher's: spec family
 * `swiglu_backward`, op_args_nn.h), two new contiguous results (grad_gate
 * in gate's dtype, grad_up in up's): one pass in chunks, each operand read
 * or written in place when it is contiguous f32, else through
 * cpu_load_f32 / cpu_store_f32. The results are new, so nothing aliases
 * what is written. */
static lpx_status k_swiglu_backward(lpx_call *c)
{
    const lpx_swiglu_backward_args *sa = lpx_op_args_of(c);
    lpx_tensor *g = sa->grad, *a = sa->gate, *b = sa->up;
    lpx_status st;
    lpx_tensor *dg = NULL, *du = NULL;
    if ((st = cpu_new(c, a->dtype, a->ndim, a->shape, &dg)) || (st = cpu_new(c, b->dtype, b->ndim, b->shape, &du))) {
        lpx_tensor_release(dg);
        return st;
    }
    cpu_view vg, va, vb, vdg, vdu;
    cpu_view_of(&vg, g);
    cpu_view_of(&va, a);
    cpu_view_of(&vb, b);
    cpu_view_of(&vdg, dg);
    cpu_view_of(&vdu, du);
    const float *fg = cpu_view_f32(&vg), *fa = cpu_view_f32(&va), *fb = cpu_view_f32(&vb);
    float *fdg = cpu_view_f32(&vdg), *fdu = cpu_view_f32(&vdu);
    float tg[CPU_CHUNK], ta[CPU_CHUNK], tb[CPU_CHUNK], tdg[CPU_CHUNK], tdu[CPU_CHUNK];
    for (int64_t start = 0; start < vdg.numel; start += CPU_CHUNK) {
        int64_t m = vdg.numel - start < CPU_CHUNK ? vdg.numel - start : CPU_CHUNK;
        const float *pg = fg ? fg + start : tg, *pa = fa ? fa + start : ta, *pb = fb ? fb + start : tb;
        if (!fg) cpu_load_f32(&vg, start, m, tg);
        if (!fa) cpu_load_f32(&va, start, m, ta);
        if (!fb) cpu_load_f32(&vb, start, m, tb);
        float *pdg = fdg ? fdg + start : tdg, *pdu = fdu ? fdu + start : tdu;
        for (int64_t i = 0; i < m; i++) lpx_swiglu_grad(pg[i], pa[i], pb[i], &pdg[i], &pdu[i]);
        if (!fdg) cpu_store_f32(&vdg, start, m, tdg, 0);
        if (!fdu) cpu_store_f32(&vdu, start, m, tdu, 0);
    }
    cpu_ret(c, dg);
    cpu_ret(c, du);
    return LPX_OK;
}

/* ---- unary and scalar ops -------------------------------------------- */

static void un_run(uop op, const cpu_view *vx, const cpu_view *vo, float s)
{
    float tx[CPU_CHUNK];
    const float *fx = cpu_view_f32(vx);
    float *fo = cpu_view_f32(vo);
    for (int64_t start = 0; start < vo->numel; start += CPU_CHUNK) {
        int64_t m = vo->numel - start < CPU_CHUNK ? vo->numel - start : CPU_CHUNK;
        const float *px = fx ? fx + start : tx;
        if (!fx) cpu_load_f32(vx, start, m, tx);
        float *po = fo ? fo + start : tx;
        un_loop(op, po, px, s, m);
        if (!fo) cpu_store_f32(vo, start, m, tx, 0);
    }
}

/* The generic path: any byte-sized dtype and layout; an out that
 * overlaps x without its layout reads x from a private copy. */
static lpx_status unary_slow(lpx_call *c, uop op, const lpx_unary_args *u)
{
    lpx_tensor *x = u->x, *out = u->out, *res, *cx = NULL;
    lpx_status st;
    if (out) {
        lpx_tensor_retain(out);
        res = out;
    } else if ((st = cpu_new(c, x->dtype, x->ndim, x->shape, &res))) {
        return st;
    }
    if ((st = unalias(c, out, x, &cx))) {
        lpx_tensor_release(res);
        return st;
    }
    cpu_view vx, vo;
    cpu_view_of(&vx, cx ? cx : x);
    cpu_view_of(&vo, res);
    un_run(op, &vx, &vo, u->s);
    lpx_tensor_release(cx);
    cpu_ret(c, res);
    return LPX_OK;
}

/* The dispatcher's `flat` (x and out contiguous, one shape; out of x's
 * dtype), and what is the CPU's: plain CPU tensors, f32. */
static ALWAYS_INLINE bool unary_fast(const lpx_unary_args *u)
{
    const lpx_tensor *x = u->x, *r = u->out ? u->out : u->x;
    return u->flat & ((x->keys | r->keys) == CPU_ONLY_KEYS) & (x->dtype == LPX_F32);
}

static __attribute__((noinline)) lpx_status unary_rest(lpx_call *c, uop op, const lpx_unary_args *u)
{
    lpx_tensor *x = u->x;
    if (!u->out && unary_fast(u)) {
        lpx_tensor *r;
        lpx_status st = cpu_new(c, LPX_F32, x->ndim, x->shape, &r);
        if (st) return st;
        un_loop(op, f32_data(r), f32_data(x), u->s, x->numel);
        cpu_ret(c, r);
        return LPX_OK;
    }
    return unary_slow(c, op, u);
}

/* The contract (x dense, the result's shape and dtype, a valid `out`) is
 * the dispatcher's: spec family `unary` (op_args_elementwise.h). */
static ALWAYS_INLINE lpx_status unary(lpx_call *c, uop op)
{
    const lpx_unary_args *u = lpx_op_args_of(c);
    lpx_tensor *x = u->x, *o = u->out;
    if (o && LPX_LIKELY(unary_fast(u))) {
        const float *px = f32_data(x);
        float *po = f32_data(o);
        if (LPX_LIKELY(same_or_disjoint(po, px, x->numel))) {
            un_loop(op, po, px, u->s, x->numel);
            atomic_fetch_add_explicit(&o->refcount, 1, memory_order_relaxed);
            cpu_ret(c, o);
            return LPX_OK;
        }
    }
    return unary_rest(c, op, u);
}

#define K_UNARY(op, N) static lpx_status k_##op(lpx_call *c) { return unary(c, U_##N); }
LPX_UNARY_OPS(K_UNARY)

/* ---- cast, copy_, fill_ ---------------------------------------------- */

/* The contract of cast, copy_ and fill_ (the dtypes and shapes they
 * take, dst writable) is the dispatcher's: spec families `cast`, `copy`
 * and `fill` (op_args_elementwise.h).
 *
 * cast: packed dtypes (elements not a whole number of bytes, or encoded in
 * groups: block > 1) go through lpx_convert over the whole buffer, which
 * needs x contiguous and starting on a byte-group boundary. Byte-sized
 * dtypes take any layout. */
static lpx_status k_cast(lpx_call *c)
{
    const lpx_cast_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x;
    lpx_dtype dt = a->dtype;
    unsigned flags = a->saturate ? LPX_CONVERT_SATURATE : 0u;
    lpx_status st;
    const lpx_dtype_traits *td = lpx_dtype_get(dt);
    const lpx_dtype_traits *tx = lpx_dtype_get(x->dtype);
    lpx_tensor *y;
    bool packed = td->bits % 8 || td->block > 1 || tx->bits % 8 || tx->block > 1;
    if (!packed) {
        if ((st = cpu_new(c, dt, x->ndim, x->shape, &y))) return st;
        cpu_view vy, vx;
        cpu_view_of(&vy, y);
        cpu_view_of(&vx, x);
        st = cpu_view_copy(&vy, &vx, flags);
    } else {
        /* the CPU's own limit (it has no code for a strided packed
         * layout), not the op's contract */
        if (!lpx_tensor_is_contiguous(x) || x->offset % tx->block) {
            char s[160];
            return lpx_error(LPX_EDTYPE,
                             "cast: %s -> %s involves a packed dtype; the cpu kernel needs x contiguous and starting "
                             "on a group of %d elements (x: shape %s, offset %lld)",
                             tx->name, td->name, tx->block, lpx_tensor_shape_str(x, s, sizeof s), (long long)x->offset);
        }
        if ((st = cpu_new(c, dt, x->ndim, x->shape, &y))) return st;
        st = lpx_convert(lpx_tensor_data(y), dt, lpx_tensor_data(x), x->dtype, (size_t)x->numel, flags);
    }
    if (st) {
        lpx_tensor_release(y);
        return st;
    }
    cpu_ret(c, y);
    return LPX_OK;
}

static lpx_status k_copy_(lpx_call *c)
{
    const lpx_copy_args *a = lpx_op_args_of(c);
    lpx_tensor *dst = a->dst, *src = a->src;
    lpx_status st;
    lpx_tensor *tmp = NULL;
    if (may_overlap(dst, src)) {
        if (same_layout(dst, src)) goto done; /* copying onto itself */
        /* read src from a private copy, in its own dtype (exact) */
        if ((st = cpu_new(c, src->dtype, src->ndim, src->shape, &tmp))) return st;
        cpu_view vt, vs;
        cpu_view_of(&vt, tmp);
        cpu_view_of(&vs, src);
        if ((st = cpu_view_copy(&vt, &vs, 0))) {
            lpx_tensor_release(tmp);
            return st;
        }
    }
    cpu_view vd, vs;
    cpu_view_of(&vd, dst);
    cpu_view_init(&vs, tmp ? tmp : src, dst->ndim, dst->shape);
    st = cpu_view_copy(&vd, &vs, 0);
    lpx_tensor_release(tmp);
    if (st) return st;
done:
    lpx_tensor_retain(dst);
    cpu_ret(c, dst);
    return LPX_OK;
}

static lpx_status k_fill_(lpx_call *c)
{
    const lpx_fill_args *a = lpx_op_args_of(c);
    lpx_tensor *dst = a->dst;
    lpx_status st;
    const lpx_dtype_traits *tr = lpx_dtype_get(dst->dtype);
    float v = a->value;
    _Alignas(8) unsigned char pat[8];
    tr->from_f32(&v, pat, 1, 0);
    cpu_view vd;
    cpu_view_of(&vd, dst);
    size_t esz = (size_t)vd.elem_size;
    if (vd.contiguous && vd.numel) {
        unsigned char *p = (unsigned char *)vd.base;
        size_t total = (size_t)vd.numel * esz, done = esz;
        bool one_byte = true;
        for (size_t i = 1; i < esz; i++) one_byte = one_byte && pat[i] == pat[0];
        if (one_byte) {
            memset(p, pat[0], total);
        } else {
            memcpy(p, pat, esz);
            while (done < total) { /* doubling copies of whole elements */
                size_t k = done < total - done ? done : total - done;
                memcpy(p + done, p, k);
                done += k;
            }
        }
    } else if (vd.numel) {
        /* the value seen as a tensor of dst's shape with all strides 0 */
        cpu_view vs = vd;
        vs.base = (char *)pat;
        for (int i = 0; i < vs.ndim; i++) vs.strides[i] = 0;
        vs.contiguous = false;
        if ((st = cpu_view_copy(&vd, &vs, 0))) return st;
    }
    lpx_tensor_retain(dst);
    cpu_ret(c, dst);
    return LPX_OK;
}

lpx_status lpx_cpu_register_elementwise(void)
{
    static const struct { lpx_op op; lpx_kernel_fn fn; } table[] = {
#define ROW(op, N) {LPX_OP_##op, k_##op},
        LPX_BINARY_OPS(ROW) LPX_UNARY_OPS(ROW)
#undef ROW
        {LPX_OP_swiglu_backward, k_swiglu_backward},
        {LPX_OP_cast, k_cast}, {LPX_OP_copy_, k_copy_}, {LPX_OP_fill_, k_fill_},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        lpx_status st = cpu_reg(table[i].op, table[i].fn);
        if (st) return st;
    }
    return LPX_OK;
}
