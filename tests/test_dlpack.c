/* DLPack import/export: round trips for every dtype, strided and offset
 * views, ownership (deleters run exactly once, after the last view),
 * read-only, the legacy struct, bad input, kind flatten/unflatten. The
 * client on the other side (PyTorch, NumPy) is exercised by
 * tests/python/test_binding.py. */
#include <stdint.h>
#include "check.h"

/* ---- a mock producer: owns a buffer and its shape/strides arrays */
typedef struct producer {
    DLManagedTensorVersioned m;
    DLManagedTensor l;
    int64_t shape[LPX_MAX_DIMS + 2], strides[LPX_MAX_DIMS + 2];
    unsigned char *buf;
    int *calls;
} producer;

static void prod_v_deleter(DLManagedTensorVersioned *m)
{
    producer *p = m->manager_ctx;
    (*p->calls)++;
    free(p->buf);
    free(p);
}

static void prod_l_deleter(DLManagedTensor *m)
{
    producer *p = m->manager_ctx;
    (*p->calls)++;
    free(p->buf);
    free(p);
}

static producer *prod_new(DLDataType dt, int ndim, const int64_t *shape, const int64_t *strides,
                          size_t nbytes, uint64_t byte_offset, int *calls)
{
    producer *p = calloc(1, sizeof *p);
    p->buf = calloc(1, nbytes + byte_offset + 16);
    p->calls = calls;
    for (int i = 0; i < ndim && i < LPX_MAX_DIMS + 2; i++) {
        p->shape[i] = shape[i];
        if (strides) p->strides[i] = strides[i];
    }
    DLTensor t = {p->buf, {kDLCPU, 0}, ndim, dt, p->shape, strides ? p->strides : NULL, byte_offset};
    p->m.version.major = 1;
    p->m.version.minor = 1;
    p->m.manager_ctx = p;
    p->m.deleter = prod_v_deleter;
    p->m.dl_tensor = t;
    p->l.manager_ctx = p;
    p->l.deleter = prod_l_deleter;
    p->l.dl_tensor = t;
    return p;
}

static void test_dtype_map(void)
{
    for (lpx_dtype d = 0; d < LPX_DTYPE_BUILTIN_COUNT; d++) {
        DLDataType t;
        lpx_dtype back = -1;
        CHECK_OK(lpx_dlpack_dtype_to(d, &t));
        CHECK_OK(lpx_dlpack_dtype_from(t, &back));
        CHECKF(back == d, "%s -> code %u bits %u -> %s", lpx_dtype_name(d), t.code, t.bits, lpx_dtype_name(back));
        CHECK(t.lanes == 1);
    }
    DLDataType t;
    CHECK_OK(lpx_dlpack_dtype_to(LPX_F8E4M3FN, &t));
    CHECK(t.code == kDLFloat8_e4m3fn && t.bits == 8);
    CHECK_OK(lpx_dlpack_dtype_to(LPX_F8E5M2, &t));
    CHECK(t.code == kDLFloat8_e5m2 && t.bits == 8);
    CHECK_OK(lpx_dlpack_dtype_to(LPX_BF16, &t));
    CHECK(t.code == kDLBfloat && t.bits == 16);
    lpx_dtype d;
    DLDataType bad1 = {kDLComplex, 64, 1}, bad2 = {kDLFloat, 64, 1}, bad3 = {kDLFloat, 32, 4}, bad4 = {200, 8, 1};
    CHECK_ERR(lpx_dlpack_dtype_from(bad1, &d), LPX_EDTYPE);
    CHECK_ERR(lpx_dlpack_dtype_from(bad2, &d), LPX_EDTYPE);
    CHECK_ERR(lpx_dlpack_dtype_from(bad3, &d), LPX_EDTYPE);
    CHECK_ERR(lpx_dlpack_dtype_from(bad4, &d), LPX_EDTYPE);
    DLDataType e8 = {kDLFloat8_e8m0fnu, 8, 1};
    CHECK_ERR(lpx_dlpack_dtype_from(e8, &d), LPX_EDTYPE); /* MX plugin not loaded */
    CHECK(strstr(lpx_last_error(), "e8m0") != NULL);
    CHECK_ERR(lpx_dlpack_dtype_to(LPX_F32, NULL), LPX_EINVAL);
    CHECK_ERR(lpx_dlpack_dtype_to(77, &t), LPX_EDTYPE);
}

/* export -> import for every built-in dtype: same bytes, same memory */
static void test_roundtrip_every_dtype(void)
{
    for (lpx_dtype d = 0; d < LPX_DTYPE_BUILTIN_COUNT; d++) {
        int64_t shape[2] = {3, 5};
        lpx_tensor *t = NULL, *back = NULL;
        CHECK_OK(lpx_tensor_new(d, 2, shape, lpx_cpu(), &t));
        size_t nb = lpx_dtype_nbytes(d, 15);
        unsigned char *p = lpx_tensor_data(t);
        for (size_t i = 0; i < nb; i++) p[i] = (unsigned char)(i * 7 + (size_t)d);
        if (d == LPX_BOOL) for (size_t i = 0; i < nb; i++) p[i] &= 1;
        DLManagedTensorVersioned *m = NULL;
        CHECK_OK(lpx_to_dlpack(t, &m));
        if (!m) { lpx_tensor_release(t); continue; }
        CHECK(m->version.major == DLPACK_MAJOR_VERSION);
        CHECK(m->flags == 0);
        CHECK(m->dl_tensor.data == lpx_tensor_data(t));
        CHECK(m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == 3 && m->dl_tensor.shape[1] == 5);
        CHECK(m->dl_tensor.strides[0] == 5 && m->dl_tensor.strides[1] == 1);
        CHECK(m->dl_tensor.device.device_type == kDLCPU);
        CHECK(lpx_tensor_refcount(t) == 2);
        CHECK_OK(lpx_from_dlpack(m, &back));
        CHECK(back && lpx_tensor_dtype(back) == d);
        CHECK(back && lpx_tensor_data(back) == lpx_tensor_data(t)); /* zero-copy */
        CHECK(back && memcmp(lpx_tensor_data(back), p, nb) == 0);
        lpx_tensor_release(t); /* the import keeps the memory alive */
        CHECK(back && lpx_tensor_refcount(back) == 1);
        CHECK(back && memcmp(lpx_tensor_data(back), lpx_tensor_data(back), nb) == 0);
        lpx_tensor_release(back); /* runs the export deleter, which releases t */
    }
}

/* strided and offset views export with their strides; byte_offset imports */
static void test_strided_offset(void)
{
    int64_t shape[2] = {4, 6};
    lpx_tensor *t = NULL, *v = NULL, *back = NULL;
    CHECK_OK(lpx_arange(0, 24, 1, LPX_F32, lpx_cpu(), &t));
    lpx_tensor *t2 = NULL;
    CHECK_OK(lpx_reshape(t, 2, shape, &t2));
    /* view: rows 1..3, every second column, transposed */
    int64_t vs[2] = {3, 3}, vst[2] = {2, 6};
    CHECK_OK(lpx_tensor_view_of(t2, 2, vs, vst, 7, &v));
    DLManagedTensorVersioned *m = NULL;
    CHECK_OK(lpx_to_dlpack(v, &m));
    CHECK(m && m->dl_tensor.strides[0] == 2 && m->dl_tensor.strides[1] == 6);
    CHECK(m && m->dl_tensor.data == (float *)lpx_tensor_data(t2) + 7 && m->dl_tensor.byte_offset == 0);
    CHECK_OK(lpx_from_dlpack(m, &back));
    CHECK(back && !lpx_tensor_is_contiguous(back));
    CHECK(back && ((float *)lpx_tensor_data(back))[0] == 7.0f);
    CHECK(back && ((float *)lpx_tensor_data(back))[2 * 1 + 6 * 2] == 21.0f); /* [1][2] = 7 + 2 + 12 */
    lpx_tensor *sum = NULL;
    CHECK_OK(lpx_sum(back, 0, NULL, false, &sum)); /* the kernels read the strided import */
    /* elements 7,9,11, 13,15,17, 19,21,23 */
    CHECK(sum && ((float *)lpx_tensor_data(sum))[0] == 135.0f);
    lpx_tensor_release(sum);
    lpx_tensor_release(back);
    lpx_tensor_release(v);
    lpx_tensor_release(t2);
    lpx_tensor_release(t);

    /* an imported byte_offset, with explicit strides */
    int calls = 0;
    int64_t sh[1] = {4}, st[1] = {2};
    DLDataType f32 = {kDLFloat, 32, 1};
    producer *p = prod_new(f32, 1, sh, st, 8 * sizeof(float), 12, &calls);
    float *f = (float *)(p->buf + 12);
    for (int i = 0; i < 8; i++) f[i] = (float)i;
    lpx_tensor *x = NULL;
    CHECK_OK(lpx_from_dlpack(&p->m, &x));
    CHECK(x && lpx_tensor_data(x) == (void *)(p->buf + 12));
    CHECK(x && lpx_tensor_strides(x)[0] == 2);
    lpx_tensor *c = NULL;
    CHECK_OK(lpx_contiguous(x, &c));
    CHECK(c && ((float *)lpx_tensor_data(c))[3] == 6.0f);
    lpx_tensor_release(c);
    lpx_tensor_release(x);
    CHECK(calls == 1);
}

/* the producer's deleter runs once, after the last lpx view */
static void test_ownership(void)
{
    int calls = 0;
    int64_t sh[2] = {2, 3};
    DLDataType f32 = {kDLFloat, 32, 1};
    producer *p = prod_new(f32, 2, sh, NULL, 6 * sizeof(float), 0, &calls);
    lpx_tensor *x = NULL, *v = NULL, *tr = NULL;
    CHECK_OK(lpx_from_dlpack(&p->m, &x));
    CHECK_OK(lpx_narrow(x, 1, 1, 2, &v));
    CHECK_OK(lpx_t(x, &tr));
    lpx_tensor_release(x);
    CHECK(calls == 0);
    lpx_tensor_release(v);
    CHECK(calls == 0);
    /* re-export of an import: the chain keeps the memory */
    DLManagedTensorVersioned *m = NULL;
    CHECK_OK(lpx_to_dlpack(tr, &m));
    lpx_tensor_release(tr);
    CHECK(calls == 0);
    m->deleter(m);
    CHECK(calls == 1);

    /* a failed import leaves the struct to the caller: deleter not run */
    calls = 0;
    int64_t bad[1] = {-3};
    producer *q = prod_new(f32, 1, bad, NULL, 16, 0, &calls);
    lpx_tensor *y = (lpx_tensor *)0x1;
    CHECK_ERR(lpx_from_dlpack(&q->m, &y), LPX_EINVAL);
    CHECK(y == NULL && calls == 0);
    q->m.deleter(&q->m);
    CHECK(calls == 1);

    /* an export is independent of the tensor's other references */
    lpx_tensor *t = NULL;
    CHECK_OK(lpx_full(1, sh, 2.0, LPX_F32, lpx_cpu(), &t));
    DLManagedTensorVersioned *e1 = NULL, *e2 = NULL;
    CHECK_OK(lpx_to_dlpack(t, &e1));
    CHECK_OK(lpx_to_dlpack(t, &e2));
    CHECK(lpx_tensor_refcount(t) == 3);
    lpx_tensor_release(t);
    e1->deleter(e1);
    CHECK(((float *)e2->dl_tensor.data)[1] == 2.0f);
    e2->deleter(e2);
}

static void test_readonly(void)
{
    int calls = 0;
    int64_t sh[1] = {4};
    DLDataType f32 = {kDLFloat, 32, 1};
    producer *p = prod_new(f32, 1, sh, NULL, 4 * sizeof(float), 0, &calls);
    p->m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    lpx_tensor *x = NULL, *one = NULL, *v = NULL, *r = NULL;
    CHECK_OK(lpx_from_dlpack(&p->m, &x));
    CHECK(lpx_tensor_is_readonly(x));
    CHECK_OK(lpx_full(1, sh, 1.0, LPX_F32, lpx_cpu(), &one));
    CHECK_ERR(lpx_fill_(x, 3.0), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "read-only") != NULL);
    CHECK_ERR(lpx_copy_(x, one), LPX_EINVAL);
    CHECK_ERR(lpx_add_out(one, one, x), LPX_EINVAL);
    CHECK(((float *)p->buf)[0] == 0.0f); /* untouched */
    CHECK_OK(lpx_narrow(x, 0, 1, 2, &v)); /* views share the flag */
    CHECK(lpx_tensor_is_readonly(v));
    CHECK_ERR(lpx_fill_(v, 3.0), LPX_EINVAL);
    CHECK_OK(lpx_add(x, one, &r)); /* reading is fine; the result is writable */
    CHECK(!lpx_tensor_is_readonly(r));
    CHECK_OK(lpx_fill_(r, 5.0));
    CHECK_OK(lpx_copy_(one, x)); /* read-only as a source is fine */
    /* re-export keeps the flag; the legacy struct refuses unless allowed */
    DLManagedTensorVersioned *m = NULL;
    CHECK_OK(lpx_to_dlpack(v, &m));
    CHECK(m && (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
    if (m) m->deleter(m);
    DLManagedTensor *l = NULL;
    CHECK_ERR(lpx_to_dlpack_legacy(v, false, &l), LPX_EINVAL);
    CHECK(l == NULL);
    CHECK_OK(lpx_to_dlpack_legacy(v, true, &l));
    if (l) l->deleter(l);
    lpx_tensor_release(r);
    lpx_tensor_release(v);
    lpx_tensor_release(one);
    lpx_tensor_release(x);
    CHECK(calls == 1);
    CHECK(!lpx_tensor_is_readonly(NULL));
}

static void test_legacy(void)
{
    int calls = 0;
    int64_t sh[2] = {2, 2};
    DLDataType bf = {kDLBfloat, 16, 1};
    producer *p = prod_new(bf, 2, sh, NULL, 8, 0, &calls);
    uint16_t *h = (uint16_t *)p->buf;
    h[0] = 0x3f80; h[1] = 0x4000; h[2] = 0xbf80; h[3] = 0x4040; /* 1 2 -1 3 */
    lpx_tensor *x = NULL, *f = NULL;
    CHECK_OK(lpx_from_dlpack_legacy(&p->l, &x));
    CHECK(x && lpx_tensor_dtype(x) == LPX_BF16 && !lpx_tensor_is_readonly(x));
    CHECK_OK(lpx_cast(x, LPX_F32, false, &f));
    CHECK(f && ((float *)lpx_tensor_data(f))[3] == 3.0f && ((float *)lpx_tensor_data(f))[2] == -1.0f);
    /* legacy export then import */
    DLManagedTensor *l = NULL;
    lpx_tensor *back = NULL;
    CHECK_OK(lpx_to_dlpack_legacy(f, false, &l));
    CHECK_OK(lpx_from_dlpack_legacy(l, &back));
    CHECK(back && lpx_tensor_data(back) == lpx_tensor_data(f));
    lpx_tensor_release(back);
    lpx_tensor_release(f);
    lpx_tensor_release(x);
    CHECK(calls == 1);
    CHECK_ERR(lpx_from_dlpack_legacy(NULL, &x), LPX_EINVAL);
}

static void test_bad_input(void)
{
    lpx_tensor *x = (lpx_tensor *)0x1;
    CHECK_ERR(lpx_from_dlpack(NULL, &x), LPX_EINVAL);
    CHECK(x == NULL);
    CHECK_ERR(lpx_to_dlpack(NULL, NULL), LPX_EINVAL);
    DLManagedTensorVersioned *m = (DLManagedTensorVersioned *)0x1;
    CHECK_ERR(lpx_to_dlpack(NULL, &m), LPX_EINVAL);
    CHECK(m == NULL);
    int calls = 0;
    int64_t sh[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    DLDataType f32 = {kDLFloat, 32, 1};
    producer *p = prod_new(f32, 9, sh, NULL, 4, 0, &calls);
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EINVAL); /* ndim > 8 */
    p->m.dl_tensor.ndim = -1;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EINVAL);
    p->m.dl_tensor.ndim = 2;
    p->m.dl_tensor.dtype.code = 99;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EDTYPE);
    CHECK(strstr(lpx_last_error(), "99") != NULL);
    p->m.dl_tensor.dtype = f32;
    p->m.version.major = 2;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EABI);
    p->m.version.major = 1;
    int64_t neg[2] = {-1, 1};
    p->m.dl_tensor.strides = neg;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EINVAL);
    CHECK(strstr(lpx_last_error(), "negative") != NULL);
    p->m.dl_tensor.strides = NULL;
    p->m.dl_tensor.shape = NULL;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EINVAL);
    p->m.dl_tensor.shape = p->shape;
    void *data = p->m.dl_tensor.data;
    p->m.dl_tensor.data = NULL;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EINVAL);
    p->m.dl_tensor.data = data;
    p->m.dl_tensor.device.device_type = kDLCUDA;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EDEVICE);
    CHECK(strstr(lpx_last_error(), "kDLCUDA") != NULL);
    p->m.dl_tensor.device.device_type = kDLMetal;
    CHECK_ERR(lpx_from_dlpack(&p->m, &x), LPX_EDEVICE);
    p->m.dl_tensor.device.device_type = kDLCPU;
    CHECK(calls == 0);
    CHECK_OK(lpx_from_dlpack(&p->m, &x)); /* and now it is fine */
    lpx_tensor_release(x);
    CHECK(calls == 1);
    /* empty tensors may have NULL data */
    int64_t z[2] = {0, 3};
    producer *e = prod_new(f32, 2, z, NULL, 0, 0, &calls);
    free(e->buf);
    e->buf = NULL;
    e->m.dl_tensor.data = NULL;
    CHECK_OK(lpx_from_dlpack(&e->m, &x));
    CHECK(lpx_tensor_numel(x) == 0);
    lpx_tensor_release(x);
    CHECK(calls == 2);
}

static void test_kind_flatten(void)
{
    int64_t shape[2] = {64, 32};
    lpx_tensor *x = NULL, *q8 = NULL, *q4 = NULL, *r8 = NULL, *r4 = NULL, *d1 = NULL, *d2 = NULL;
    CHECK_OK(lpx_randn(2, shape, 7, LPX_F32, lpx_cpu(), &x));
    CHECK_OK(lpx_float8_quantize(x, NULL, &q8, NULL));
    lpx_nf4_config cfg = lpx_nf4_config_default();
    CHECK_OK(lpx_nf4_quantize(x, &cfg, &q4));
    lpx_tensor *qs[2] = {q8, q4};
    lpx_tensor **rs[2] = {&r8, &r4};
    for (int k = 0; k < 2; k++) {
        lpx_dlpack_flat f;
        CHECK_OK(lpx_dlpack_flatten(qs[k], &f));
        CHECK(f.ninner == lpx_tensor_inner_count(qs[k]));
        CHECK(!strcmp(f.kind, k ? "nf4" : "float8"));
        CHECK(!strcmp(f.names[0], k ? "codes" : "data"));
        CHECK(f.inner[0] && f.inner[0]->dl_tensor.data == lpx_tensor_data(lpx_tensor_inner(qs[k], 0)));
        if (k == 0) CHECK(f.inner[0]->dl_tensor.dtype.code == kDLFloat8_e4m3fn);
        CHECK_OK(lpx_dlpack_unflatten(&f, rs[k]));
        for (int i = 0; i < f.ninner; i++) CHECK(f.inner[i] == NULL); /* consumed */
        lpx_dlpack_flat_release(&f);
        CHECK(*rs[k] && lpx_tensor_kind(*rs[k]) == lpx_tensor_kind(qs[k]));
    }
    CHECK_OK(lpx_kind_to_dense(q8, &d1));
    CHECK_OK(lpx_kind_to_dense(r8, &d2));
    CHECK(d1 && d2 && memcmp(lpx_tensor_data(d1), lpx_tensor_data(d2), 64 * 32 * 4) == 0);
    lpx_tensor_release(d1);
    lpx_tensor_release(d2);
    CHECK_OK(lpx_kind_to_dense(q4, &d1));
    CHECK_OK(lpx_kind_to_dense(r4, &d2));
    CHECK(d1 && d2 && memcmp(lpx_tensor_data(d1), lpx_tensor_data(d2), 64 * 32 * 4) == 0);
    lpx_tensor_release(d1);
    lpx_tensor_release(d2);

    /* a corrupted payload is refused by the kind's unflatten; leftovers
     * stay the caller's */
    lpx_dlpack_flat f;
    CHECK_OK(lpx_dlpack_flatten(q4, &f));
    f.shape[0] = 1 << 20; /* codes too short for this shape */
    lpx_tensor *bad = NULL;
    CHECK_ERR(lpx_dlpack_unflatten(&f, &bad), LPX_EINVAL);
    CHECK(bad == NULL);
    lpx_dlpack_flat_release(&f);
    CHECK_OK(lpx_dlpack_flatten(q8, &f));
    snprintf(f.kind, sizeof f.kind, "nosuchkind");
    CHECK_ERR(lpx_dlpack_unflatten(&f, &bad), LPX_ENOTFOUND);
    lpx_dlpack_flat_release(&f);
    CHECK_ERR(lpx_dlpack_flatten(x, &f), LPX_EINVAL); /* dense */
    DLManagedTensorVersioned *m = NULL;
    CHECK_ERR(lpx_to_dlpack(q8, &m), LPX_EINVAL); /* kind: use flatten */
    CHECK(strstr(lpx_last_error(), "flatten") != NULL);
    char nb[32];
    CHECK(!strcmp(lpx_kind_inner_name(lpx_float8_kind(), 2, nb, sizeof nb), "scale_inv"));
    CHECK(!strcmp(lpx_kind_inner_name(lpx_nf4_kind(), 3, nb, sizeof nb), "mean"));
    CHECK(!strcmp(lpx_kind_inner_name(NULL, 5, nb, sizeof nb), "inner5"));
    lpx_tensor_release(r8);
    lpx_tensor_release(r4);
    lpx_tensor_release(q8);
    lpx_tensor_release(q4);
    lpx_tensor_release(x);
}

int main(void)
{
    RUN(test_dtype_map);
    RUN(test_roundtrip_every_dtype);
    RUN(test_strided_offset);
    RUN(test_ownership);
    RUN(test_readonly);
    RUN(test_legacy);
    RUN(test_bad_input);
    RUN(test_kind_flatten);
    return CHECK_DONE();
}
