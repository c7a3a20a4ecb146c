/* Shared helpers of the libFuzzer targets (tests/fuzz/README.md): a reader
 * that turns the fuzzer's bytes into values (0 once the input runs out),
 * and the setup every target does once. */
#ifndef LPX_FUZZ_UTIL_H
#define LPX_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint8_t fz_u8(fz *f)
{
    if (!f->n) return 0;
    f->n--;
    return *f->p++;
}

static inline uint16_t fz_u16(fz *f) { uint16_t v = fz_u8(f); return (uint16_t)(v | (uint16_t)fz_u8(f) << 8); }
static inline uint32_t fz_u32(fz *f) { uint32_t v = fz_u16(f); return v | (uint32_t)fz_u16(f) << 16; }
static inline uint64_t fz_u64(fz *f) { uint64_t v = fz_u32(f); return v | (uint64_t)fz_u32(f) << 32; }

/* Copies up to n bytes (zeros past the end of the input). */
static inline void fz_bytes(fz *f, void *dst, size_t n)
{
    size_t k = n < f->n ? n : f->n;
    memcpy(dst, f->p, k);
    memset((char *)dst + k, 0, n - k);
    f->p += k;
    f->n -= k;
}

/* A NUL-terminated string of at most `max` bytes: a length byte, then the
 * bytes (a 0xff length means NULL). The result is malloc'ed (free it). */
static inline char *fz_str(fz *f, size_t max, int *is_null)
{
    uint8_t len = fz_u8(f);
    if (is_null) *is_null = len == 0xff;
    if (len == 0xff) return NULL;
    size_t n = len < max ? len : max;
    char *s = malloc(n + 1);
    if (!s) abort();
    fz_bytes(f, s, n);
    s[n] = 0;
    return s;
}

/* The library is initialised once; a failure there is a finding. */
static inline void fz_init(void)
{
    if (lpx_init() != LPX_OK) {
        fprintf(stderr, "fuzz: lpx_init failed: %s\n", lpx_last_error());
        abort();
    }
}

/* Loads the MX plugin (LPX_FUZZ_MX_PLUGIN from the environment, else the
 * path the build baked in) so MX dtypes and kinds are fuzzed too. */
static inline void fz_load_mx(void)
{
    const char *mx = getenv("LPX_FUZZ_MX_PLUGIN");
#ifdef LPX_FUZZ_MX_PLUGIN
    if (!mx) mx = LPX_FUZZ_MX_PLUGIN;
#endif
    if (mx && mx[0] && lpx_plugin_load(mx, NULL)) {
        fprintf(stderr, "fuzz: cannot load %s: %s\n", mx, lpx_last_error());
        abort();
    }
}

/* Stops the target when an invariant the library promises is broken. */
#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "fuzz: invariant failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); abort(); } } while (0)

#endif
