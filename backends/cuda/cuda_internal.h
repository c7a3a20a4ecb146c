/* Shared declarations of the CUDA backend plugin (lpx-cuda.so): device
 * state, error mapping, argument helpers and the kernel-group registration
 * functions. Valid C11 and CUDA C++: the .c files (host code, cuBLASLt) and
 * the .cu files (kernels) both include it. The plugin sees lpx's public
 * headers only, plus the header-only numerics of core/numerics (LPX_HD:
 * the same scalar encoders the CPU backend uses, so casts are bit-exact). */
#ifndef LPX_CUDA_INTERNAL_H
#define LPX_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <lpx/lpx.h>
#include <lpx/plugin.h>
#include <lpx/cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_MAX_DEVICES 16

/* The backend's dispatch key bit (set once by the plugin's init). */
extern int cu_key;

/* ---- devices, streams, memory (cuda_device.c) ----------------------- */

/* Number of devices the plugin serves (<= CU_MAX_DEVICES). */
int cu_device_count(void);
/* The stream of device `index`: every kernel, copy, allocation and free of
 * lpx-cuda.so on that device is ordered on it (one stream per device, so
 * stream-ordered allocation needs no cross-stream events). */
cudaStream_t cu_stream(int index);
/* Multiprocessor count of device `index` (for grid sizing). */
int cu_sm_count(int index);
/* 1 if memory-bound kernels on device `index` are launched with
 * programmatic dependent launch (cuda_launch.cuh): compute capability 9.0
 * or newer, and the environment does not set LPX_CUDA_PDL=0. */
int cu_pdl(int index);
/* Makes `dev` current for this thread; the error names `op`. */
lpx_status cu_use(const char *op, lpx_device dev);
/* Registers the cuda backend (memory services); sets cu_key. */
lpx_status cu_register_backend(const lpx_host *h);
/* Stream-ordered device scratch memory (workspaces, kernel argument
 * tables): freed with cu_scratch_free on the same device's stream. */
void *cu_scratch_alloc(int device, size_t nbytes);
void cu_scratch_free(int device, void *p, size_t nbytes);

/* ---- errors (cuda_util.c) ------------------------------------------- */

/* LPX_EDEVICE (LPX_ENOMEM for cudaErrorMemoryAllocation) with
 * "<op>: <call> failed: <cudaErrorName> (<description>)". */
lpx_status cu_fail(cudaError_t e, const char *op, const char *call);
/* Checks the launch just made (cudaGetLastError) and names the kernel. */
lpx_status cu_launched(const char *op, const char *kernel);

#define CU_CHECK(op, call)                                        \
    do {                                                          \
        cudaError_t cu_e_ = (call);                               \
        if (cu_e_ != cudaSuccess) return cu_fail(cu_e_, (op), #call); \
    } while (0)

/* ---- kernel arguments (cuda_util.c) --------------------------------- */

/* Appends a result (takes over the reference). */
static inline void cu_ret(lpx_call *c, lpx_tensor *t) { c->rets[c->nrets++] = lpx_v_tensor(t); }

/* Name of the running op, for messages. */
static inline const char *cu_op(const lpx_call *c) { return lpx_op_name(c->op); }

/* A kernel's own dtype limit, not an op's contract (that is the
 * dispatcher's: op_args.h): lpx-cuda has code for the built-in dtypes
 * only (plugin dtypes stay on the CPU). `arg` names t in the message; a
 * NULL t (an absent optional tensor) passes. */
static inline lpx_status cu_builtin_dtype(const lpx_call *c, const char *arg, const lpx_tensor *t)
{
    if (!t) return LPX_OK;
    lpx_dtype d = lpx_tensor_dtype(t);
    if ((unsigned)d < LPX_DTYPE_BUILTIN_COUNT) return LPX_OK;
    return lpx_error(LPX_EDTYPE, "%s: tensor '%s' has dtype %s, which the cuda kernels do not support", cu_op(c), arg,
                     lpx_dtype_name(d));
}
/* New contiguous tensor on `dev`; the message names the op. */
lpx_status cu_new(const lpx_call *c, lpx_dtype dtype, int ndim, const int64_t *shape, lpx_device dev,
                  lpx_tensor **out);
/* Registers a boxed kernel for the cuda key through the host table. */
lpx_status cu_reg(const lpx_host *h, lpx_op op, lpx_kernel_fn fn);

/* A tensor's geometry, passed by value to kernels that index strided or
 * broadcast operands: element (i0..in) of the logical shape is at
 * data + sum(i_k * strides[k]) elements (broadcast dims have stride 0). */
typedef struct cu_geom {
    int ndim;
    int64_t numel;
    int64_t shape[LPX_MAX_DIMS];
    int64_t strides[LPX_MAX_DIMS];
} cu_geom;

/* Geometry of t with its own shape. */
void cu_geom_of(cu_geom *g, const lpx_tensor *t);
/* Geometry of t broadcast to (ndim, shape) (t must be broadcastable). */
void cu_geom_broadcast(cu_geom *g, const lpx_tensor *t, int ndim, const int64_t *shape);
/* True if the geometry is row-major without gaps. */
bool cu_geom_contiguous(const cu_geom *g);

/* ---- kernel groups: one registration function per source file ------- */

lpx_status cu_register_views(const lpx_host *h);      /* cuda_views.c: adopts the CPU view kernels */
lpx_status cu_register_creation(const lpx_host *h);   /* cuda_creation.cu */
lpx_status cu_register_copy(const lpx_host *h);       /* cuda_copy.cu: cast, copy_, fill_ */
lpx_status cu_register_elementwise(const lpx_host *h);/* cuda_elementwise.cu */
lpx_status cu_register_reduce(const lpx_host *h);     /* cuda_reduce.cu */
lpx_status cu_register_nn(const lpx_host *h);         /* cuda_nn.cu */
lpx_status cu_register_gemm(const lpx_host *h);       /* cuda_gemm_*.c: cuBLASLt */
lpx_status cu_register_float8(const lpx_host *h);     /* cuda_fp8_*.cu */
lpx_status cu_register_nf4(const lpx_host *h);        /* cuda_nf4.cu */
lpx_status cu_register_adamw(const lpx_host *h);      /* cuda_adamw.cu */
lpx_status cu_register_attention(const lpx_host *h);  /* cuda_attention.cu: rope, attention */

/* Device copies shared by the groups (cuda_copy.cu). Both take dense CUDA
 * tensors on one device (the caller checked) and name the call's op in
 * errors; the work is queued on the device's stream.
 * cu_copy_convert: dst <- src, src broadcast to dst's shape, any layouts,
 * dtypes converted like lpx_convert (`sat`: LPX_CONVERT_SATURATE); an src
 * that overlaps dst in memory is read through a private copy first.
 * cu_fill_bytes: every element of t set to the `esize` bytes at `pat`. */
lpx_status cu_copy_convert(const lpx_call *c, lpx_tensor *dst, const lpx_tensor *src, bool sat);
lpx_status cu_fill_bytes(const lpx_call *c, lpx_tensor *t, const void *pat, int esize);
/* True if the byte ranges of dense a and b may intersect; true if they have
 * the same dtype, address, shape and strides (size-1 dims ignored), so an
 * elementwise kernel may read one and write the other in place. */
bool cu_may_overlap(const lpx_tensor *a, const lpx_tensor *b);
bool cu_same_layout(const lpx_tensor *a, const lpx_tensor *b);

/* Releases what the groups cache (cuBLASLt handle and plans). */
void cu_gemm_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
