/* Helpers shared by the collectives tests (local and MPI): a seeded
 * random source, random fills in any dtype, and timing. static inline:
 * each test uses a subset. */
#ifndef LPX_TESTS_COMM_UTIL_H
#define LPX_TESTS_COMM_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include "lpx/lpx.h"

static uint64_t rng_state;

/* xorshift64, upper bits */
static inline uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static inline void seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }

/* Random floats in [-8, 8) with full mantissas, encoded to dtype d. */
static inline void fill_random(void *dst, lpx_dtype d, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = (float)((double)rnd() / 4294967296.0 * 16.0 - 8.0);
    lpx_convert(dst, d, f, LPX_F32, n, 0);
    free(f);
}

static inline double ms_since(uint64_t t0) { return (double)(lpx_now_ns() - t0) / 1e6; }

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
