/* Fuzz target: DLPack import (lpx_from_dlpack, lpx_from_dlpack_legacy).
 * The input describes a managed tensor field by field:
 *   u8 variant (bit 0: legacy struct, bit 1: data NULL, bit 2: strides NULL,
 *      bit 3: shape NULL), u32 version.major, u32 version.minor, u64 flags,
 *   u8 dtype.code, u8 dtype.bits, u16 dtype.lanes, u8 device_type selector,
 *   i32 device_id, u8 ndim (as int8), ndim x i64 shape, ndim x i64 strides,
 *   u64 byte_offset, then the rest is the buffer `data` points at (an exact
 *   size heap copy, so ASan sees any read past it).
 * Import itself must never read the data, so it runs on any geometry. When
 * the harness can tell that the declared view lies inside the buffer, the
 * tensor is also read (contiguous copy, cast to f32) and exported back.
 * Checked: the producer's deleter runs exactly once on success (at the
 * last release) and never on failure; a failure leaves *out NULL. */
#include "fuzz_util.h"
#include "lpx/dlpack.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int deleted;

static void del_v(DLManagedTensorVersioned *m) { (void)m; deleted++; }
static void del_l(DLManagedTensor *m) { (void)m; deleted++; }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    return 0;
}

/* Bytes the view spans from data + byte_offset, or -1 if it does not fit
 * in `avail` (or is too big to read cheaply). */
static int64_t extent(const DLTensor *dl, int64_t elem_bits, size_t avail)
{
    if (dl->byte_offset > avail) return -1;
    int64_t numel = 1, last = 0, stride = 1;
    for (int i = dl->ndim - 1; i >= 0; i--) {
        int64_t d = dl->shape[i], s = dl->strides ? dl->strides[i] : stride;
        if (d == 0) return 0;
        if (d > (1 << 16) || s > (1 << 24) || s < 0) return -1;
        numel *= d;
        if (numel > (1 << 16)) return -1;
        last += (d - 1) * s;
        stride *= d;
    }
    int64_t bytes = ((last + 1) * elem_bits + 7) / 8;
    return bytes <= (int64_t)(avail - dl->byte_offset) ? bytes : -1;
}

static void read_back(lpx_tensor *t)
{
    lpx_tensor *c = NULL, *f = NULL;
    if (lpx_contiguous(t, &c) == LPX_OK) {
        if (lpx_cast(c, LPX_F32, true, &f) == LPX_OK) lpx_tensor_release(f);
        lpx_tensor_release(c);
    }
    DLManagedTensorVersioned *e = NULL;
    if (lpx_to_dlpack(t, &e) == LPX_OK) {
        lpx_tensor *back = NULL;
        if (lpx_from_dlpack(e, &back) == LPX_OK) lpx_tensor_release(back);
        else e->deleter(e);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint8_t variant = fz_u8(&f);
    DLManagedTensorVersioned mv;
    DLManagedTensor ml;
    memset(&mv, 0, sizeof mv);
    memset(&ml, 0, sizeof ml);
    mv.version.major = fz_u32(&f);
    mv.version.minor = fz_u32(&f);
    mv.flags = fz_u64(&f);
    DLTensor dl;
    memset(&dl, 0, sizeof dl);
    dl.dtype.code = fz_u8(&f);
    dl.dtype.bits = fz_u8(&f);
    dl.dtype.lanes = fz_u16(&f);
    static const int devs[] = {kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged, kDLROCM, kDLOpenCL};
    uint8_t ds = fz_u8(&f);
    dl.device.device_type = ds < 6 ? (DLDeviceType)devs[ds] : (DLDeviceType)ds;
    dl.device.device_id = (int32_t)fz_u32(&f);
    dl.ndim = (int8_t)fz_u8(&f);
    int64_t shape[64], strides[64];
    int nd = dl.ndim < 0 ? 0 : dl.ndim > 64 ? 64 : dl.ndim;
    for (int i = 0; i < nd; i++) shape[i] = (int64_t)fz_u64(&f);
    for (int i = 0; i < nd; i++) strides[i] = (int64_t)fz_u64(&f);
    dl.shape = variant & 8 ? NULL : shape;
    dl.strides = variant & 4 ? NULL : strides;
    dl.byte_offset = fz_u64(&f);
    size_t avail = f.n;
    void *buf = NULL;
    if (!(variant & 2)) {
        buf = malloc(avail ? avail : 1);
        if (!buf) abort();
        fz_bytes(&f, buf, avail);
        dl.data = buf;
    }

    deleted = 0;
    lpx_tensor *t = (lpx_tensor *)1;
    lpx_status st;
    if (variant & 1) {
        ml.dl_tensor = dl;
        ml.deleter = del_l;
        st = lpx_from_dlpack_legacy(&ml, &t);
    } else {
        mv.dl_tensor = dl;
        mv.deleter = del_v;
        st = lpx_from_dlpack(&mv, &t);
    }
    FZ_ASSERT(deleted == 0);
    if (st == LPX_OK) {
        FZ_ASSERT(t != NULL && lpx_tensor_ndim(t) == dl.ndim);
        for (int i = 0; i < dl.ndim; i++) FZ_ASSERT(lpx_tensor_shape(t)[i] == dl.shape[i]);
        if (!(variant & 1)) FZ_ASSERT(lpx_tensor_is_readonly(t) == !!(mv.flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(t));
        FZ_ASSERT(tr != NULL);
        if (buf && lpx_tensor_device(t).type == LPX_DEVICE_CPU && extent(&dl, tr->bits, avail) >= 0)
            read_back(t);
        lpx_tensor_release(t);
        FZ_ASSERT(deleted == 1);
    } else {
        FZ_ASSERT(t == NULL && lpx_last_error()[0]);
    }
    free(buf);
    return 0;
}
