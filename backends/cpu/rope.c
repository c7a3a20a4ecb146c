/* CPU rotary position embedding and its backward (lpx_rope in ops.h).
 *
 * Hugging Face's convention, computed as transformers does in f32: the
 * angle of pair i at position p is the f32 product p * inv_freq[i]; its
 * cosine and sine are rounded once to f32 (evaluated in double, so they
 * are the correctly rounded values); out1 = x1 c - x2 s, out2 = x2 c + x1 s
 * in f32. The backward is the rotation by -angle, the transpose. */
#include <math.h>
#include "cpu_internal.h"

/* The contract (shapes, the offset's range, float dtypes) is the
 * dispatcher's: spec family `rope` (op_args_nn.h). */
static lpx_status rope_common(lpx_call *c, bool backward)
{
    const lpx_rope_args *a = lpx_op_args_of(c);
    lpx_tensor *x = a->x, *fr = a->inv_freq;
    int64_t offset = a->offset, half = a->half;
    const char *op = cpu_op_name(c);
    lpx_status st;
    int64_t T = x->shape[1], H = x->shape[2], D = 2 * half, rows = x->numel / D;
    lpx_tensor *y = NULL;
    float *freq = NULL, *cs = NULL, *row = NULL;
    if ((st = cpu_new(c, x->dtype, x->ndim, x->shape, &y))) return st;
    freq = lpx_malloc((size_t)half * sizeof *freq);
    cs = lpx_malloc((size_t)(2 * T * half) * sizeof *cs);
    row = lpx_malloc((size_t)D * sizeof *row);
    if (!freq || !cs || !row) {
        st = lpx_error(LPX_ENOMEM, "%s: cannot allocate the cos/sin table for %lld positions", op, (long long)T);
        goto out;
    }
    cpu_view fv, xv, yv;
    cpu_view_of(&fv, fr);
    cpu_load_f32(&fv, 0, half, freq);
    /* the cos/sin table of this call's positions: [T][half] cos, then sin */
    float *cosv = cs, *sinv = cs + T * half;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)(offset + t) * freq[i];
            cosv[t * half + i] = (float)cos((double)ang);
            sinv[t * half + i] = (float)sin((double)ang);
        }
    float sgn = backward ? -1.0f : 1.0f;
    cpu_view_of(&xv, x);
    cpu_view_of(&yv, y);
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = (r / H) % T;
        const float *cr = cosv + t * half, *sr = sinv + t * half;
        cpu_load_f32(&xv, r * D, D, row);
        for (int64_t i = 0; i < half; i++) {
            float a = row[i], b = row[i + half], s = sgn * sr[i];
            row[i] = a * cr[i] - b * s;
            row[i + half] = b * cr[i] + a * s;
        }
        cpu_store_f32(&yv, r * D, D, row, 0);
    }
    cpu_ret(c, y);
    y = NULL;
out:
    lpx_free(freq);
    lpx_free(cs);
    lpx_free(row);
    lpx_tensor_release(y);
    return st;
}

static lpx_status k_rope(lpx_call *c) { return rope_common(c, false); }
static lpx_status k_rope_backward(lpx_call *c) { return rope_common(c, true); }

lpx_status lpx_cpu_register_rope(void)
{
    lpx_status st = cpu_reg(LPX_OP_rope, k_rope);
    return st ? st : cpu_reg(LPX_OP_rope_backward, k_rope_backward);
}
