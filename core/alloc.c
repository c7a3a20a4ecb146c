/* Every lpx allocation goes through these wrappers, so a test can make the
 * Nth allocation fail (lpx__fail_alloc_after) and check that every entry
 * point returns LPX_ENOMEM without leaking or corrupting state. */
#include <stdlib.h>
#include <string.h>
#include "lpx_internal.h"

/* < 0: never fail. Otherwise the number of allocations that still succeed. */
static _Atomic long fail_countdown = -1;

/* Test hook (exported for the OOM test, not part of the stable API). */
LPX_API void lpx__fail_alloc_after(long n);
void lpx__fail_alloc_after(long n) { atomic_store(&fail_countdown, n); }

static bool should_fail(void)
{
    long c = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (LPX_LIKELY(c < 0)) return false;
    return atomic_fetch_sub(&fail_countdown, 1) <= 0 ? (atomic_store(&fail_countdown, 0), true) : false;
}

void *lpx_malloc(size_t n) { return should_fail() ? NULL : malloc(n ? n : 1); }
void *lpx_calloc(size_t c, size_t s) { return should_fail() ? NULL : calloc(c ? c : 1, s ? s : 1); }
void *lpx_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n ? n : 1); }
void lpx_free(void *p) { free(p); }

char *lpx_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = lpx_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}
