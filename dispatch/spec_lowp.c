/* The spec families of include/lpx/op_args_lowp.h: their meta functions
 * (the conventions are spec.c's). Each makes the checks the ops' CPU
 * kernels made before the spec, in their order and with their messages:
 * the dense check of each tensor (in the order the kernel checked them,
 * which is not always the schema's), then the op's public meta function
 * (dispatch/meta_fp8.c, meta_fp8_block.c, meta_nf4.c). Checks that read
 * data stay in the kernels (op_args_lowp.h). */
#include "spec_internal.h"

/* ---- fp8_quantize, fp8_quantize_t ------------------------------------ */

/* fp8_quantize: x dense, the contract, then the static scale dense (the
 * CPU kernel checked it last, when it read it). */
static lpx_status fp8_quantize_contract(const lpx_call *c, lpx_fp8_quantize_args *a, bool has_dim, int64_t dim)
{
    lpx_status st;
    if ((st = dense(c, 0, a->x)) ||
        (st = lpx_meta_fp8_quantize(op_name(c), a->x, a->scale, a->fp8, has_dim, dim, a->scale_max, &a->g)))
        return st;
    return a->scale ? dense(c, 1, a->scale) : LPX_OK;
}

/* fp8_quantize_t's own: t dense, on x's device. */
static lpx_status dense_on(const lpx_call *c, const char *arg, const lpx_tensor *t, const lpx_tensor *x)
{
    if (t->kind)
        return lpx_error(LPX_EINVAL, "%s: %s is of kind '%s'; the op takes dense tensors", op_name(c), arg,
                         lpx_kind_name(t->kind));
    if (t->device.type != x->device.type || t->device.index != x->device.index)
        return lpx_error(LPX_EDEVICE, "%s: %s is on another device than x", op_name(c), arg);
    return LPX_OK;
}

/* t a contiguous dt [d0, d1]. */
static lpx_status out_like(const lpx_call *c, const char *arg, const lpx_tensor *t, lpx_dtype dt, int64_t d0,
                           int64_t d1)
{
    bool contiguous = lpx_tensor_is_contiguous(t);
    if (t->dtype == dt && t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1 && contiguous) return LPX_OK;
    char s1[160];
    return lpx_error(LPX_ESHAPE, "%s: %s is %s %s%s; expected a contiguous %s [%lld, %lld]", op_name(c), arg,
                     lpx_dtype_name(t->dtype), lpx_tensor_shape_str(t, s1, sizeof s1),
                     contiguous ? "" : " (not contiguous)", lpx_dtype_name(dt), (long long)d0, (long long)d1);
}

static lpx_status fp8_quantize_t(const lpx_call *c, lpx_fp8_quantize_args *a)
{
    const char *op = op_name(c);
    lpx_tensor *x = a->x;
    lpx_status st;
    if ((st = dense_on(c, "x", x, x))) return st;
    if (x->ndim != 2) {
        char s1[160];
        return lpx_error(LPX_ESHAPE, "%s: x has shape %s; the transposed quantize takes a 2-D x [R, C]", op,
                         lpx_tensor_shape_str(x, s1, sizeof s1));
    }
    if (a->axiswise && a->scale)
        return lpx_error(LPX_EINVAL, "%s: a static scale was given with axiswise scaling; static scales are "
                                     "tensorwise here (x and x^T would need different ones)", op);
    if ((st = lpx_meta_fp8_dtype(op, "fp8", a->fp8))) return st;
    int64_t R = x->shape[0], C = x->shape[1];
    if ((st = dense_on(c, "qt", a->qt, x)) || (st = dense_on(c, "scale_t", a->scale_t, x)) ||
        (st = dense_on(c, "scale_inv_t", a->scale_inv_t, x)) || (st = out_like(c, "qt", a->qt, a->fp8, C, R)))
        return st;
    const lpx_tensor *s = a->scale_t, *si = a->scale_inv_t;
    int64_t ns = a->axiswise ? C : 1;
    if (s->dtype != LPX_F32 || si->dtype != LPX_F32 || s->numel != ns || si->numel != ns)
        return lpx_error(LPX_ESHAPE, "%s: scale_t and scale_inv_t must be f32 with %lld value%s (%s)", op,
                         (long long)ns, ns == 1 ? "" : "s", a->axiswise ? "[C, 1]" : "numel 1, tensorwise");
    if (a->axiswise &&
        ((st = out_like(c, "scale_t", s, LPX_F32, C, 1)) || (st = out_like(c, "scale_inv_t", si, LPX_F32, C, 1))))
        return st;
    /* the kernel writes qt, scale_t, scale_inv_t: a read-only one is
     * refused here, before anything is written */
    const lpx_tensor *outs[3] = {a->qt, s, si};
    static const char *const out_names[3] = {"qt", "scale_t", "scale_inv_t"};
    for (int i = 0; i < 3; i++)
        if (outs[i]->storage && outs[i]->storage->readonly)
            return lpx_error(LPX_EINVAL, "%s: %s is read-only (e.g. a read-only DLPack import)", op, out_names[i]);
    /* q, scale, scale_inv, stats are fp8_quantize(x, scale, fp8, axiswise
     * ? 1 : none, ...): its contract, under this op's name */
    return fp8_quantize_contract(c, a, a->axiswise, 1);
}

lpx_status lpx__spec_fp8_quantize(const lpx_call *c, void *p)
{
    lpx_fp8_quantize_args *a = p;
    const lpx_value *v = c->args;
    a->x = v[0].u.t;
    a->scale = opt_tensor(c, 1);
    a->fp8 = v[2].u.d;
    a->pow2 = v[4].u.b;
    a->scale_max = v[5].u.f;
    a->saturate = v[6].u.b;
    if (c->op == LPX_OP_fp8_quantize_t) {
        a->axiswise = v[3].u.b;
        a->qt = v[7].u.t;
        a->scale_t = v[8].u.t;
        a->scale_inv_t = v[9].u.t;
        return fp8_quantize_t(c, a);
    }
    a->axiswise = false;
    a->qt = a->scale_t = a->scale_inv_t = NULL;
    bool has_dim = v[3].tag == LPX_TAG_I64;
    return fp8_quantize_contract(c, a, has_dim, has_dim ? v[3].u.i : 0);
}

/* ---- fp8_dequantize, fp8_scale_from_amax ----------------------------- */

lpx_status lpx__spec_fp8_dequantize(const lpx_call *c, void *p)
{
    lpx_fp8_dequantize_args *a = p;
    lpx_tensor *q = c->args[0].u.t, *si = c->args[1].u.t;
    lpx_dtype dt = c->args[2].u.d;
    lpx_status st;
    if ((st = dense(c, 0, q)) || (st = dense(c, 1, si)) || (st = lpx_meta_fp8_dequantize(op_name(c), q, si, dt)))
        return st;
    a->q = q;
    a->scale_inv = si;
    a->dtype = dt;
    return LPX_OK;
}

lpx_status lpx__spec_fp8_scale_from_amax(const lpx_call *c, void *p)
{
    lpx_fp8_scale_from_amax_args *a = p;
    lpx_tensor *am = c->args[0].u.t;
    lpx_status st;
    a->amax = am;
    a->fp8 = c->args[1].u.d;
    a->pow2 = c->args[2].u.b;
    a->scale_max = c->args[3].u.f;
    if ((st = dense(c, 0, am))) return st;
    return lpx_meta_fp8_scale_from_amax(op_name(c), am, a->fp8, a->scale_max);
}

/* ---- fp8_scaled_mm --------------------------------------------------- */

lpx_status lpx__spec_fp8_scaled_mm(const lpx_call *c, void *p)
{
    lpx_fp8_scaled_mm_args *a = p;
    lpx_tensor *x = c->args[0].u.t, *xs = c->args[1].u.t, *w = c->args[2].u.t, *ws = c->args[3].u.t;
    lpx_tensor *bias = opt_tensor(c, 4);
    lpx_status st;
    /* the CPU kernel's order: a, b, then their scales */
    if ((st = dense(c, 0, x)) || (st = dense(c, 2, w)) || (st = dense(c, 1, xs)) || (st = dense(c, 3, ws)) ||
        (bias && (st = dense(c, 4, bias))))
        return st;
    a->a = x;
    a->a_scale_inv = xs;
    a->b = w;
    a->b_scale_inv = ws;
    a->bias = bias;
    a->out_dtype = c->args[5].u.d;
    a->fast_accum = c->args[6].u.b;
    return lpx_meta_fp8_scaled_mm(op_name(c), x, xs, w, ws, bias, a->out_dtype, &a->g);
}

/* ---- blockwise fp8 ---------------------------------------------------- */

lpx_status lpx__spec_fp8_quantize_block(const lpx_call *c, void *p)
{
    lpx_fp8_quantize_block_args *a = p;
    lpx_tensor *x = c->args[0].u.t;
    lpx_status st;
    a->x = x;
    a->fp8 = c->args[1].u.d;
    a->pow2 = c->args[4].u.b;
    a->saturate = c->args[5].u.b;
    if ((st = dense(c, 0, x))) return st;
    return lpx_meta_fp8_quantize_block(op_name(c), x, a->fp8, c->args[2].u.i, c->args[3].u.i, &a->g);
}

lpx_status lpx__spec_fp8_dequantize_block(const lpx_call *c, void *p)
{
    lpx_fp8_dequantize_block_args *a = p;
    lpx_tensor *q = c->args[0].u.t, *si = c->args[1].u.t;
    lpx_status st;
    a->q = q;
    a->scale_inv = si;
    a->dtype = c->args[4].u.d;
    if ((st = dense(c, 0, q)) || (st = dense(c, 1, si))) return st;
    return lpx_meta_fp8_dequantize_block(op_name(c), q, si, c->args[2].u.i, c->args[3].u.i, a->dtype, &a->g);
}

lpx_status lpx__spec_fp8_mm_block(const lpx_call *c, void *p)
{
    lpx_fp8_mm_block_args *a = p;
    const lpx_value *v = c->args;
    lpx_tensor *x = v[0].u.t, *xs = v[1].u.t, *w = v[4].u.t, *ws = v[5].u.t, *bias = opt_tensor(c, 8);
    lpx_status st;
    if ((st = dense(c, 0, x)) || (st = dense(c, 1, xs)) || (st = dense(c, 4, w)) || (st = dense(c, 5, ws)) ||
        (bias && (st = dense(c, 8, bias))))
        return st;
    a->a = x;
    a->a_scale_inv = xs;
    a->b = w;
    a->b_scale_inv = ws;
    a->bias = bias;
    a->out_dtype = v[9].u.d;
    return lpx_meta_fp8_mm_block(op_name(c), x, xs, v[2].u.i, v[3].u.i, w, ws, v[6].u.i, v[7].u.i, bias,
                                 a->out_dtype, &a->g);
}

/* ---- nf4 -------------------------------------------------------------- */

/* Args first..first+5: codes, qscalers, factors, mean, block, scaler_block. */
static lpx_status nf4_payload(const lpx_call *c, int first, lpx_nf4_payload_args *p)
{
    const lpx_value *v = c->args + first;
    lpx_status st;
    p->codes = v[0].u.t;
    p->qscalers = v[1].u.t;
    p->factors = v[2].u.t;
    p->mean = v[3].u.t;
    p->block = v[4].u.i;
    p->scaler_block = v[5].u.i;
    if ((st = dense(c, first, p->codes)) || (st = dense(c, first + 1, p->qscalers)) ||
        (st = dense(c, first + 2, p->factors)) || (st = dense(c, first + 3, p->mean)))
        return st;
    return lpx_meta_nf4_payload(op_name(c), p->codes, p->qscalers, p->factors, p->mean, p->block, p->scaler_block,
                                &p->padded);
}

lpx_status lpx__spec_nf4_quantize(const lpx_call *c, void *p)
{
    lpx_nf4_quantize_args *a = p;
    lpx_status st;
    a->x = c->args[0].u.t;
    a->block = c->args[1].u.i;
    a->scaler_block = c->args[2].u.i;
    if ((st = dense(c, 0, a->x))) return st;
    return lpx_meta_nf4_quantize(op_name(c), a->x, a->block, a->scaler_block, &a->sz);
}

lpx_status lpx__spec_nf4_dequantize(const lpx_call *c, void *p)
{
    lpx_nf4_dequantize_args *a = p;
    lpx_status st;
    if ((st = nf4_payload(c, 0, &a->p))) return st;
    a->start = c->args[6].u.i;
    a->count = c->args[7].u.i;
    a->dtype = c->args[8].u.d;
    a->out = opt_tensor(c, 9);
    if (a->out && (st = dense(c, 9, a->out))) return st;
    return lpx_meta_nf4_range(op_name(c), a->p.padded, a->start, a->count, a->dtype, a->out);
}

lpx_status lpx__spec_nf4_mm(const lpx_call *c, void *p)
{
    lpx_nf4_mm_args *a = p;
    lpx_status st;
    a->x = c->args[0].u.t;
    a->bias = opt_tensor(c, 10);
    if ((st = dense(c, 0, a->x)) || (st = nf4_payload(c, 1, &a->p)) || (a->bias && (st = dense(c, 10, a->bias))))
        return st;
    a->rows = c->args[7].u.i;
    a->cols = c->args[8].u.i;
    a->transpose_w = c->args[9].u.b;
    return lpx_meta_nf4_mm(op_name(c), a->x, a->p.padded, a->rows, a->cols, a->transpose_w, a->bias, &a->g);
}

lpx_status lpx__spec_qlora_dropout(const lpx_call *c, void *p)
{
    lpx_qlora_dropout_args *a = p;
    lpx_status st;
    a->x = c->args[0].u.t;
    a->p = c->args[1].u.f;
    a->seed = (uint64_t)c->args[2].u.i;
    a->dtype = c->args[3].u.d;
    if ((st = dense(c, 0, a->x))) return st;
    return lpx_meta_qlora_dropout(op_name(c), a->x, a->p, a->dtype);
}
