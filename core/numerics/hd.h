/* LPX_HD marks scalar numerics that run on the host and on CUDA devices.
 * Under nvcc it expands to `__host__ __device__`, elsewhere to nothing, so
 * the headers in core/numerics stay plain C11 (and valid C++) usable by the CPU
 * backend, the CUDA kernels and the tests alike. */
#ifndef LPX_NUMERICS_HD_H
#define LPX_NUMERICS_HD_H

#ifdef __CUDACC__
#  define LPX_HD __host__ __device__
#else
#  define LPX_HD
#endif

#endif
