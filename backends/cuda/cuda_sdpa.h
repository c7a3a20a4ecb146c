/* cuDNN fused attention for lpx-cuda (cuda_sdpa.cu): a C interface over
 * the cuDNN frontend, so the attention kernels (cuda_attention.cu) pick it
 * or their reference kernels per call. Every function returns at once on a
 * machine without libcudnn (the reference path then runs). */
#ifndef LPX_CUDA_SDPA_H
#define LPX_CUDA_SDPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_SDPA_MAX_DEVICES 64

/* One attention call: q [B, T, H, D], k and v [B, S, KH, D], contiguous,
 * all bf16 (or all f16); lse f32 [B, H, T]. */
typedef struct cu_sdpa_shape {
    int device;
    int bf16;          /* 1: bf16, 0: f16 */
    int64_t B, T, S, H, KH, D;
    bool causal;
    float scale;
} cu_sdpa_shape;

/* 1 when cuDNN's fused kernels take x on a device of compute capability
 * sm_major.x and libcudnn (>= 9.0) is loaded; 0 with the reason in why. */
int cu_sdpa_fits(const cu_sdpa_shape *x, int sm_major, char *why, size_t wn);
/* Workspace bytes of x's forward or backward graph (built and cached on
 * first use); -1 with the reason in why when cuDNN refuses the shape. */
int64_t cu_sdpa_workspace(const cu_sdpa_shape *x, int backward, char *why, size_t wn);
/* Enqueue on `stream`: 0, or -1 with the reason in why (nothing queued).
 * ws: cu_sdpa_workspace bytes of device memory (NULL when 0). */
int cu_sdpa_forward(const cu_sdpa_shape *x, const void *q, const void *k, const void *v, void *o, float *lse, void *ws,
                    cudaStream_t stream, char *why, size_t wn);
int cu_sdpa_backward(const cu_sdpa_shape *x, const void *grad, const void *q, const void *k, const void *v,
                     const void *o, const float *lse, void *dq, void *dk, void *dv, void *ws, cudaStream_t stream,
                     char *why, size_t wn);
/* Sets the environment the cuDNN frontend reads (the CUDA runtime it
 * opens: CUDNN_FRONTEND_CUDART_LIB_NAME, unless the user set it). Called
 * once from lpx_plugin_init, before lpx ops can run on other threads:
 * nothing in lpx-cuda writes the environment later (setenv beside a
 * concurrent getenv is unsafe in glibc). */
void cu_sdpa_init_env(void);
/* The attention path of this process in words (for lpx info); the number
 * of calls that ran on cuDNN so far (capped at 1000000). */
int cu_sdpa_describe(char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
