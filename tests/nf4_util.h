/* Shared by the nf4 test programs (tests/test_nf4_*.c): the
 * helpers and fixtures their cases use. Static inline: each program
 * compiles only what it calls. */
#ifndef LPX_TESTS_NF4_UTIL_H
#define LPX_TESTS_NF4_UTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include "check.h"
#include "tensor_util.h"
#include "core/numerics/nf4.h"

/* backends/cpu/nf4.c test hook: 0 forces the portable scalar decode */
extern int lpx__nf4_simd;

typedef struct ref_q {
    int64_t padded, nb, nsb;
    uint8_t *codes;
    int8_t *qs;
    float *f;
    float mean;
} ref_q;

/* Contiguous f32 copy of a dense tensor's values (caller frees). */
static inline float *values_f32(lpx_tensor *t)
{
    lpx_tensor *c = NULL;
    CHECK_OK(lpx_cast(t, LPX_F32, false, &c));
    if (!c) return NULL;
    lpx_tensor *cc = NULL;
    CHECK_OK(lpx_contiguous(c, &cc));
    int64_t n = lpx_tensor_numel(cc);
    float *v = malloc((size_t)(n + 1) * sizeof(float));
    memcpy(v, lpx_tensor_data(cc), (size_t)n * sizeof(float));
    lpx_tensor_release(c);
    lpx_tensor_release(cc);
    return v;
}

static inline lpx_nf4_config cfg(int64_t block, int64_t sblock)
{
    lpx_nf4_config c = lpx_nf4_config_default();
    c.block = block;
    c.scaler_block = sblock;
    return c;
}

/* Every nf4 tensor of the program is gone (the last case of each nf4 test
 * program). */
static inline void test_no_leaks(void)
{
    CHECKF(lpx_kind_live_tensors(lpx_nf4_kind()) == 0, "%lld nf4 tensors still alive",
           (long long)lpx_kind_live_tensors(lpx_nf4_kind()));
}
#endif
