/* Strided, broadcasting f32 load/store in chunks, and the small helpers
 * the CPU kernels share (argument checks are the dispatcher's: op_args.h). */
#include <string.h>
#include "cpu_internal.h"

lpx_status cpu_new(const lpx_call *c, lpx_dtype dtype, int ndim, const int64_t *shape, lpx_tensor **out)
{
    lpx_status st = lpx_tensor_new(dtype, ndim, shape, lpx_cpu(), out);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        return lpx_error(st, "%s: %s", cpu_op_name(c), msg);
    }
    return LPX_OK;
}

void cpu_view_init(cpu_view *v, const lpx_tensor *t, int ndim, const int64_t *shape)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(t->dtype);
    v->ndim = ndim;
    v->dtype = t->dtype;
    v->elem_size = tr->bits / 8;
    v->base = lpx_tensor_data(t);
    v->numel = 1;
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        v->shape[i] = shape[i];
        v->strides[i] = (it >= 0 && t->shape[it] != 1) ? t->strides[it] : 0;
        v->numel *= shape[i];
    }
    int64_t s = 1;
    v->contiguous = true;
    for (int i = ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != s) { v->contiguous = false; break; }
        s *= v->shape[i];
    }
}

void cpu_view_of(cpu_view *v, const lpx_tensor *t) { cpu_view_init(v, t, t->ndim, t->shape); }

/* Walks logical elements [start, start+n) as runs along the last dim and
 * calls run(ptr, stride, len, k) with k = elements already visited. */
#define FOR_EACH_RUN(v, start, n, BODY)                                              \
    do {                                                                              \
        int64_t idx_[LPX_MAX_DIMS];                                                   \
        int64_t rem_ = (start);                                                       \
        for (int d_ = (v)->ndim - 1; d_ >= 0; d_--) {                                 \
            idx_[d_] = (v)->shape[d_] ? rem_ % (v)->shape[d_] : 0;                    \
            rem_ = (v)->shape[d_] ? rem_ / (v)->shape[d_] : 0;                        \
        }                                                                             \
        int64_t k_ = 0;                                                               \
        int last_ = (v)->ndim - 1;                                                    \
        while (k_ < (n)) {                                                            \
            int64_t off_ = 0;                                                         \
            for (int d_ = 0; d_ < (v)->ndim; d_++) off_ += idx_[d_] * (v)->strides[d_]; \
            int64_t len_ = last_ >= 0 ? (v)->shape[last_] - idx_[last_] : 1;         \
            if (len_ > (n) - k_) len_ = (n) - k_;                                     \
            char *ptr_ = (v)->base + off_ * (v)->elem_size;                           \
            int64_t stride_ = last_ >= 0 ? (v)->strides[last_] : 0;                   \
            BODY;                                                                     \
            k_ += len_;                                                               \
            if (last_ >= 0) {                                                         \
                idx_[last_] += len_;                                                  \
                for (int d_ = last_; d_ > 0 && idx_[d_] >= (v)->shape[d_]; d_--) {    \
                    idx_[d_] = 0;                                                     \
                    idx_[d_ - 1]++;                                                   \
                }                                                                     \
            }                                                                         \
        }                                                                             \
    } while (0)

void cpu_load_f32(const cpu_view *v, int64_t start, int64_t n, float *dst)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(v->dtype);
    if (v->contiguous) {
        tr->to_f32(v->base + start * v->elem_size, dst, (size_t)n);
        return;
    }
    unsigned char tmp[CPU_CHUNK * 8];
    FOR_EACH_RUN(v, start, n, {
        if (stride_ == 1) {
            tr->to_f32(ptr_, dst + k_, (size_t)len_);
        } else {
            for (int64_t done = 0; done < len_;) {
                int64_t m = len_ - done < CPU_CHUNK ? len_ - done : CPU_CHUNK;
                for (int64_t j = 0; j < m; j++)
                    memcpy(tmp + j * v->elem_size, ptr_ + (done + j) * stride_ * v->elem_size, (size_t)v->elem_size);
                tr->to_f32(tmp, dst + k_ + done, (size_t)m);
                done += m;
            }
        }
    });
}

void cpu_store_f32(const cpu_view *v, int64_t start, int64_t n, const float *src, unsigned flags)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(v->dtype);
    if (v->contiguous) {
        tr->from_f32(src, v->base + start * v->elem_size, (size_t)n, flags);
        return;
    }
    unsigned char tmp[CPU_CHUNK * 8];
    FOR_EACH_RUN(v, start, n, {
        if (stride_ == 1) {
            tr->from_f32(src + k_, ptr_, (size_t)len_, flags);
        } else {
            for (int64_t done = 0; done < len_;) {
                int64_t m = len_ - done < CPU_CHUNK ? len_ - done : CPU_CHUNK;
                tr->from_f32(src + k_ + done, tmp, (size_t)m, flags);
                for (int64_t j = 0; j < m; j++)
                    memcpy(ptr_ + (done + j) * stride_ * v->elem_size, tmp + j * v->elem_size, (size_t)v->elem_size);
                done += m;
            }
        }
    });
}

lpx_status cpu_contiguous_f32(const lpx_tensor *t, lpx_tensor **out)
{
    if (t->dtype == LPX_F32 && lpx_tensor_is_contiguous(t)) {
        lpx_tensor_retain((lpx_tensor *)t);
        *out = (lpx_tensor *)t;
        return LPX_OK;
    }
    lpx_status st = lpx_tensor_new(LPX_F32, t->ndim, t->shape, lpx_cpu(), out);
    if (st) return st;
    cpu_view v;
    cpu_view_of(&v, t);
    cpu_load_f32(&v, 0, v.numel, lpx_tensor_data(*out));
    return LPX_OK;
}
