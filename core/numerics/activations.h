/* The activation functions and their derivatives, in f32, written once for
 * the CPU backend (backends/cpu/elementwise.c) and the CUDA kernels
 * (backends/cuda/cuda_elementwise.cu): the same expression in the same
 * order on both, so the GPU suite can compare their results bit for bit
 * (both are compiled without FMA contraction). */
#ifndef LPX_NUMERICS_ACTIVATIONS_H
#define LPX_NUMERICS_ACTIVATIONS_H

#include <math.h>
#include "hd.h"

#define LPX_INV_SQRT2 0.70710678118654752440f
#define LPX_INV_SQRT_2PI 0.39894228040143267794f

/* x * sigmoid(x) */
static inline LPX_HD float lpx_silu_f(float x) { return x / (1.0f + expf(-x)); }

/* x * Phi(x), the exact (erf) GELU */
static inline LPX_HD float lpx_gelu_f(float x) { return 0.5f * x * (1.0f + erff(x * LPX_INV_SQRT2)); }

/* d/dx x*sigmoid(x) = s * (1 + x * (1 - s)) */
static inline LPX_HD float lpx_silu_grad(float x)
{
    float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

/* SwiGLU, the Llama MLP's activation: silu(gate) * up. silu rounds to f32
 * first, then one f32 multiply: in f32 storage, the bits of the silu op
 * followed by the mul op. */
static inline LPX_HD float lpx_swiglu_f(float gate, float up) { return lpx_silu_f(gate) * up; }

/* The backward of lpx_swiglu_f for the incoming gradient g:
 * d/dgate = (g * up) * silu'(gate), d/dup = g * silu(gate), each an f32
 * expression in this order (silu and silu' as above). */
static inline LPX_HD void lpx_swiglu_grad(float g, float gate, float up, float *dgate, float *dup)
{
    *dgate = g * up * lpx_silu_grad(gate);
    *dup = g * lpx_silu_f(gate);
}

/* d/dx x*Phi(x) = Phi(x) + x * phi(x) */
static inline LPX_HD float lpx_gelu_grad(float x)
{
    float cdf = 0.5f * (1.0f + erff(x * LPX_INV_SQRT2));
    return cdf + x * LPX_INV_SQRT_2PI * expf(-0.5f * x * x);
}

#endif
