/* The dtype traits table and lpx_convert.
 *
 * The built-in dtypes are statically initialized, so lpx_dtype_get,
 * lpx_dtype_from_name and lpx_convert work before lpx_init(). Registered
 * dtypes are appended under a mutex and published by a release store of
 * the count; readers load the count with acquire and never lock. Entries
 * are never freed, so a traits pointer stays valid for the process: the
 * rollback of a failed plugin load marks its entries retired (the name is
 * free again). An id is handed out again only if no tensor was ever made
 * of it (the entry's `used` flag, set by the tensor constructors): a
 * surviving tensor keeps meaning its dtype. A reused id gets a NEW entry,
 * published through its slot with release order, so a reader that still
 * holds the old entry reads memory nobody writes (no torn traits).
 *
 * Conversions go through f32: every built-in float dtype decodes to f32
 * exactly, so decode + one RNE encode rounds once. Two cases need more
 * care and get their own paths: integer -> integer (exact through int64,
 * then clamped) and i32/i64 -> a non-f32 dtype (a round-to-odd f32
 * intermediate, so the final encode still rounds once). */
#include <float.h>
#include <pthread.h>
#include <string.h>

#include "lpx_internal.h"
#include "dtype_internal.h"
#include "numerics/float8.h"
#include "numerics/half.h"
#include "numerics/integer.h"

_Static_assert(sizeof(float) == 4 && FLT_MANT_DIG == 24, "lpx needs IEEE binary32 floats");
_Static_assert(LPX_DTYPE_BUILTIN_COUNT == 10 && LPX_DTYPE_MAX >= LPX_DTYPE_BUILTIN_COUNT,
               "built-in dtype indices changed: update the table below");

#define SAT(flags) (((flags) & LPX_CONVERT_SATURATE) != 0)

/* ---------------------------------------------------------------------
 * fp8 decode tables, generated at compile time from the same integer
 * expressions as the scalar decoders. */

#define R4_(F, b) F(b) F((b) + 1) F((b) + 2) F((b) + 3)
#define R16_(F, b) R4_(F, b) R4_(F, (b) + 4) R4_(F, (b) + 8) R4_(F, (b) + 12)
#define R64_(F, b) R16_(F, b) R16_(F, (b) + 16) R16_(F, (b) + 32) R16_(F, (b) + 48)
#define R256_(F) R64_(F, 0) R64_(F, 64) R64_(F, 128) R64_(F, 192)
#define E4M3_(c) LPX_F8E4M3FN_F32BITS((uint32_t)(c)),
#define E5M2_(c) LPX_F8E5M2_F32BITS((uint32_t)(c)),

const lpx_f8_table lpx__f8e4m3fn_table = {.u = {R256_(E4M3_)}};
const lpx_f8_table lpx__f8e5m2_table = {.u = {R256_(E5M2_)}};

/* ---------------------------------------------------------------------
 * Bulk codecs: loops over the scalar functions. src and dst must not
 * overlap (lpx_convert checks; direct callers of the traits must too).
 *
 * gcc -O2 vectorizes only loops that need neither a scalar epilogue nor
 * run-time alias checks (the "very cheap" cost model), so every loop runs
 * a fixed 16-element inner loop over restrict pointers and finishes the
 * last < 16 elements scalar. The saturate test is hoisted out of the loop. */

#define BLOCKED_(n, STMT)                                                       \
    do {                                                                        \
        size_t b_ = 0;                                                          \
        for (; b_ + 16 <= (n); b_ += 16)                                        \
            for (size_t i = b_; i < b_ + 16; i++) { STMT; }                     \
        for (size_t i = b_; i < (n); i++) { STMT; }                             \
    } while (0)

#define DECODER_(name, T, FN)                                                   \
    static void name(const void *src, float *dst, size_t n)                     \
    {                                                                           \
        const T *restrict s = src;                                              \
        float *restrict d = dst;                                                \
        BLOCKED_(n, d[i] = FN(s[i]));                                           \
    }

/* encoders taking a saturate flag */
#define ENCODER_SAT_(name, T, FN)                                               \
    static void name(const float *src, void *dst, size_t n, unsigned flags)     \
    {                                                                           \
        const float *restrict s = src;                                          \
        T *restrict d = dst;                                                    \
        if (SAT(flags))                                                         \
            BLOCKED_(n, d[i] = FN(s[i], 1));                                    \
        else                                                                    \
            BLOCKED_(n, d[i] = FN(s[i], 0));                                    \
    }

/* integer encoders always clamp, so the flag does not matter */
#define ENCODER_(name, T, FN)                                                   \
    static void name(const float *src, void *dst, size_t n, unsigned flags)     \
    {                                                                           \
        const float *restrict s = src;                                          \
        T *restrict d = dst;                                                    \
        (void)flags;                                                            \
        BLOCKED_(n, d[i] = FN(s[i]));                                           \
    }

static inline float clamp_inf(float v)
{
    return v > FLT_MAX ? FLT_MAX : v < -FLT_MAX ? -FLT_MAX : v;
}
static inline float e4m3fn_dec(uint8_t c) { return lpx__f8e4m3fn_table.f[c]; }
static inline float e5m2_dec(uint8_t c) { return lpx__f8e5m2_table.f[c]; }
static inline float u8_dec(uint8_t v) { return (float)v; }
static inline float i8_dec(int8_t v) { return (float)v; }
static inline float i32_dec(int32_t v) { return (float)v; }
static inline float i64_dec(int64_t v) { return (float)v; }
static inline float bool_dec(uint8_t v) { return v ? 1.0f : 0.0f; }
static inline float f32_sat(float v, int sat) { return sat ? clamp_inf(v) : v; }

static void f32_to_f32(const void *src, float *dst, size_t n)
{
    memcpy(dst, src, n * sizeof(float));
}

static void f32_from_f32(const float *src, void *dst, size_t n, unsigned flags)
{
    if (!SAT(flags)) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const float *restrict s = src;
    float *restrict d = dst;
    BLOCKED_(n, d[i] = f32_sat(s[i], 1));
}

DECODER_(f16_to_f32, uint16_t, lpx_f16_to_f32)
DECODER_(bf16_to_f32, uint16_t, lpx_bf16_to_f32)
DECODER_(e4m3fn_to_f32, uint8_t, e4m3fn_dec)
DECODER_(e5m2_to_f32, uint8_t, e5m2_dec)
DECODER_(u8_to_f32, uint8_t, u8_dec)
DECODER_(i8_to_f32, int8_t, i8_dec)
DECODER_(i32_to_f32, int32_t, i32_dec)
DECODER_(i64_to_f32, int64_t, i64_dec)
DECODER_(bool_to_f32, uint8_t, bool_dec)

ENCODER_SAT_(f16_from_f32, uint16_t, lpx_f32_to_f16)
ENCODER_SAT_(bf16_from_f32, uint16_t, lpx_f32_to_bf16)
ENCODER_SAT_(e4m3fn_from_f32, uint8_t, lpx_f32_to_f8e4m3fn)
ENCODER_SAT_(e5m2_from_f32, uint8_t, lpx_f32_to_f8e5m2)
ENCODER_(u8_from_f32, uint8_t, lpx_f32_to_u8)
ENCODER_(i8_from_f32, int8_t, lpx_f32_to_i8)
ENCODER_(i32_from_f32, int32_t, lpx_f32_to_i32)
ENCODER_(i64_from_f32, int64_t, lpx_f32_to_i64)
ENCODER_(bool_from_f32, uint8_t, lpx_f32_to_bool)

/* ---------------------------------------------------------------------
 * The table. Built-in names are literals; registered names are copied
 * into the entry so they do not depend on the caller's memory. */

typedef struct dtype_entry {
    lpx_dtype_traits t;
    char name[LPX_DTYPE_NAME_MAX + 1];
    atomic_bool retired;   /* unregistered by a rollback: not found by name */
    atomic_bool used;      /* a tensor was made of it: the id is never reused */
    struct dtype_entry *replaced_next; /* entries whose id was reused stay reachable */
} dtype_entry;

#define BUILTIN(idx, nm, nbits, isf, eb, mb, mx, dec, enc)                       \
    [idx] = {.t = {.struct_size = sizeof(lpx_dtype_traits), .name = nm, .bits = nbits, \
                   .block = 1, .is_float = isf, .exp_bits = eb, .mant_bits = mb,     \
                   .max = mx, .to_f32 = dec, .from_f32 = enc}}

static dtype_entry builtin[LPX_DTYPE_BUILTIN_COUNT] = {
    BUILTIN(LPX_F32, "f32", 32, true, 8, 23, FLT_MAX, f32_to_f32, f32_from_f32),
    BUILTIN(LPX_F16, "f16", 16, true, 5, 10, 65504.0, f16_to_f32, f16_from_f32),
    BUILTIN(LPX_BF16, "bf16", 16, true, 8, 7, 0x1.fep127, bf16_to_f32, bf16_from_f32),
    BUILTIN(LPX_F8E4M3FN, "f8e4m3fn", 8, true, 4, 3, 448.0, e4m3fn_to_f32, e4m3fn_from_f32),
    BUILTIN(LPX_F8E5M2, "f8e5m2", 8, true, 5, 2, 57344.0, e5m2_to_f32, e5m2_from_f32),
    BUILTIN(LPX_U8, "u8", 8, false, 0, 0, 255.0, u8_to_f32, u8_from_f32),
    BUILTIN(LPX_I8, "i8", 8, false, 0, 0, 127.0, i8_to_f32, i8_from_f32),
    BUILTIN(LPX_I32, "i32", 32, false, 0, 0, 2147483647.0, i32_to_f32, i32_from_f32),
    /* 2^63 - 1 is not a double; its nearest double 2^63 stands for it */
    BUILTIN(LPX_I64, "i64", 64, false, 0, 0, 0x1p63, i64_to_f32, i64_from_f32),
    BUILTIN(LPX_BOOL, "bool", 8, false, 0, 0, 1.0, bool_to_f32, bool_from_f32),
};

/* id -> entry: the built-ins' static entries, registered ones allocated
 * (never freed). Written under register_lock, read lock-free. */
static _Atomic(dtype_entry *) slots[LPX_DTYPE_MAX] = {
    &builtin[0], &builtin[1], &builtin[2], &builtin[3], &builtin[4],
    &builtin[5], &builtin[6], &builtin[7], &builtin[8], &builtin[9],
};
_Static_assert(LPX_DTYPE_BUILTIN_COUNT == 10, "slots lists every built-in entry");
static dtype_entry *replaced;   /* entries whose id was handed out again */
static atomic_int dtype_count = LPX_DTYPE_BUILTIN_COUNT;
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

static dtype_entry *entry(int d) { return atomic_load_explicit(&slots[d], memory_order_acquire); }

/* The table is static; this only checks it (called once from lpx_init). */
lpx_status lpx_dtype_init_builtins(void)
{
    for (int i = 0; i < LPX_DTYPE_BUILTIN_COUNT; i++)
        if (!builtin[i].t.name || !builtin[i].t.to_f32 || !builtin[i].t.from_f32)
            return lpx_error(LPX_EINTERNAL, "lpx_init: built-in dtype %d is missing", i);
    return LPX_OK;
}

const lpx_dtype_traits *lpx_dtype_get(lpx_dtype d)
{
    if (d < 0 || d >= atomic_load_explicit(&dtype_count, memory_order_acquire))
        return NULL;
    return &entry(d)->t;
}

const char *lpx_dtype_name(lpx_dtype d)
{
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    return t ? t->name : "?";
}

/* Negative on failure: LPX_ENOTFOUND for an unknown name, LPX_EINVAL for
 * NULL; both set the thread's error message. */
lpx_dtype lpx_dtype_from_name(const char *name)
{
    if (!name)
        return lpx_error(LPX_EINVAL, "lpx_dtype_from_name: name is NULL");
    int n = atomic_load_explicit(&dtype_count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (!atomic_load_explicit(&entry(i)->retired, memory_order_acquire) && strcmp(entry(i)->t.name, name) == 0)
            return i;
    return lpx_error(LPX_ENOTFOUND, "lpx_dtype_from_name: no dtype named '%s'", name);
}

int lpx_dtype_count(void)
{
    return atomic_load_explicit(&dtype_count, memory_order_acquire);
}

bool lpx_dtype_valid(lpx_dtype d)
{
    return lpx_dtype_get(d) != NULL && !atomic_load_explicit(&entry(d)->retired, memory_order_acquire);
}

/* Whole byte groups: ceil(n / block) groups of bits * block / 8 bytes.
 * 0 for an unknown dtype or n < 0; SIZE_MAX if the size overflows. */
size_t lpx_dtype_nbytes(lpx_dtype d, int64_t n)
{
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    if (!t || n <= 0)
        return 0;
    uint64_t groups = (uint64_t)n / (uint64_t)t->block + ((uint64_t)n % (uint64_t)t->block != 0);
    uint64_t gbytes = (uint64_t)t->bits * (uint64_t)t->block / 8u;
    if (groups > SIZE_MAX / gbytes)
        return SIZE_MAX;
    return (size_t)(groups * gbytes);
}

lpx_status lpx_dtype_register(const lpx_dtype_traits *traits, lpx_dtype *out)
{
    static const char *const op = "lpx_dtype_register";
    const size_t need = offsetof(lpx_dtype_traits, from_f32) + sizeof(lpx_from_f32_fn);
    if (!traits)
        return lpx_error(LPX_EINVAL, "%s: traits is NULL", op);
    if (traits->struct_size < need)
        return lpx_error(LPX_EINVAL, "%s: traits.struct_size %zu is smaller than %zu (up to from_f32)",
                         op, traits->struct_size, need);

    /* copy what the caller's struct covers; newer fields stay zero */
    lpx_dtype_traits t;
    memset(&t, 0, sizeof t);
    memcpy(&t, traits, traits->struct_size < sizeof t ? traits->struct_size : sizeof t);
    t.struct_size = sizeof t;

    if (!t.name || !t.name[0])
        return lpx_error(LPX_EINVAL, "%s: traits.name is NULL or empty", op);
    if (strlen(t.name) > LPX_DTYPE_NAME_MAX)
        return lpx_error(LPX_EINVAL, "%s: traits.name '%.20s...' is longer than %d characters",
                         op, t.name, LPX_DTYPE_NAME_MAX);
    if (!t.to_f32 || !t.from_f32)
        return lpx_error(LPX_EINVAL, "%s: dtype '%s' lacks %s", op, t.name,
                         !t.to_f32 ? "to_f32" : "from_f32");
    if (t.bits < 1 || t.bits > 64)
        return lpx_error(LPX_EINVAL, "%s: dtype '%s' has bits = %d (allowed 1..64)", op, t.name,
                         t.bits);
    if (t.block == 0)
        t.block = 1; /* zero-initialized traits mean "not packed" */
    if (t.block < 0 || t.block > LPX_DTYPE_BLOCK_MAX || (t.block & (t.block - 1)) != 0)
        return lpx_error(LPX_EINVAL, "%s: dtype '%s' has block = %d (a power of two <= %d)", op,
                         t.name, t.block, LPX_DTYPE_BLOCK_MAX);
    if ((t.bits * t.block) % 8 != 0)
        return lpx_error(LPX_EINVAL,
                         "%s: dtype '%s': block %d of %d-bit elements is not a whole number of bytes",
                         op, t.name, t.block, t.bits);
    if (t.exp_bits < 0 || t.mant_bits < 0)
        return lpx_error(LPX_EINVAL, "%s: dtype '%s' has negative exp_bits or mant_bits", op, t.name);

    lpx_status rs = lpx__journal_reserve(op);
    if (rs)
        return rs;
    pthread_mutex_lock(&register_lock);
    int n = atomic_load_explicit(&dtype_count, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        if (!atomic_load(&entry(i)->retired) && strcmp(entry(i)->t.name, t.name) == 0) {
            pthread_mutex_unlock(&register_lock);
            return lpx_error(LPX_EEXIST, "%s: dtype name '%s' is taken (index %d)", op, t.name, i);
        }
    }
    if (n >= LPX_DTYPE_MAX) {
        pthread_mutex_unlock(&register_lock);
        return lpx_error(LPX_EFULL, "%s: dtype table is full (%d entries); cannot add '%s'", op,
                         LPX_DTYPE_MAX, t.name);
    }
    dtype_entry *e = lpx_calloc(1, sizeof *e);
    if (!e) {
        pthread_mutex_unlock(&register_lock);
        return lpx_error(LPX_ENOMEM, "%s: cannot allocate the entry of dtype '%s'", op, t.name);
    }
    strcpy(e->name, t.name);
    t.name = e->name;
    e->t = t;
    /* an id popped by a rollback gets a new entry; the old one stays
     * readable by whoever still holds it */
    dtype_entry *old = atomic_load_explicit(&slots[n], memory_order_relaxed);
    if (old) {
        old->replaced_next = replaced;
        replaced = old;
    }
    atomic_store_explicit(&slots[n], e, memory_order_release);
    /* readers that see the new count also see the entry */
    atomic_store_explicit(&dtype_count, n + 1, memory_order_release);
    pthread_mutex_unlock(&register_lock);
    lpx__journal_note(LPX_REG_DTYPE, n, 0, e);
    if (out)
        *out = n;
    return LPX_OK;
}

/* Rollback of a failed plugin load. The entry is marked retired (its name
 * is free, lpx_dtype_valid is false) but keeps its traits, so a reader that
 * still holds them calls valid code (a plugin whose init ran stays mapped).
 * Retired entries at the top are popped so the count and the next index
 * return to what they were. A popped slot is reused by the next
 * registration; only a reader that kept the traits of a dtype that existed
 * solely inside a failed init could see that, and none can be handed one. */
void lpx__dtype_mark_used(lpx_dtype d)
{
    if (d >= LPX_DTYPE_BUILTIN_COUNT && d < atomic_load_explicit(&dtype_count, memory_order_acquire)) {
        dtype_entry *e = entry(d);
        if (!atomic_load_explicit(&e->used, memory_order_relaxed))
            atomic_store_explicit(&e->used, true, memory_order_relaxed);
    }
}

lpx_status lpx__dtype_unregister(lpx_dtype d)
{
    pthread_mutex_lock(&register_lock);
    int n = atomic_load_explicit(&dtype_count, memory_order_relaxed);
    if (d < LPX_DTYPE_BUILTIN_COUNT || d >= n || atomic_load(&entry(d)->retired)) {
        pthread_mutex_unlock(&register_lock);
        return lpx_error(LPX_ENOTFOUND, "lpx__dtype_unregister: dtype %d is not a registered plugin dtype", (int)d);
    }
    atomic_store_explicit(&entry(d)->retired, true, memory_order_release);
    /* free the top ids for reuse, unless a tensor was made of one: that
     * tensor must keep meaning its dtype, so its id (and those below it)
     * stay taken */
    while (n > LPX_DTYPE_BUILTIN_COUNT && atomic_load(&entry(n - 1)->retired) && !atomic_load(&entry(n - 1)->used))
        n--;
    atomic_store_explicit(&dtype_count, n, memory_order_release);
    pthread_mutex_unlock(&register_lock);
    return LPX_OK;
}

/* ---------------------------------------------------------------------
 * Element access slow paths (see dtype_internal.h). */

float lpx_dtype__load_slow(lpx_dtype d, const void *base, int64_t i)
{
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    LPX_ASSERT(t != NULL && i >= 0);
    size_t blk = (size_t)t->block, g = (size_t)i / blk * blk;
    float tmp[LPX_DTYPE_BLOCK_MAX];
    t->to_f32((const unsigned char *)base + lpx_dtype__offset(t, g), tmp, blk);
    return tmp[(size_t)i - g];
}

void lpx_dtype__store_slow(lpx_dtype d, void *base, int64_t i, float v, unsigned flags)
{
    const lpx_dtype_traits *t = lpx_dtype_get(d);
    LPX_ASSERT(t != NULL && i >= 0);
    size_t blk = (size_t)t->block, g = (size_t)i / blk * blk;
    unsigned char *p = (unsigned char *)base + lpx_dtype__offset(t, g);
    float tmp[LPX_DTYPE_BLOCK_MAX];
    if (blk > 1)
        t->to_f32(p, tmp, blk);
    tmp[(size_t)i - g] = v;
    t->from_f32(tmp, p, blk, flags);
}

/* ---------------------------------------------------------------------
 * lpx_convert */

/* elements per stack chunk: a multiple of every allowed block */
enum { CHUNK = 1024 };
_Static_assert(CHUNK % LPX_DTYPE_BLOCK_MAX == 0, "chunks must hold whole byte groups");

static bool is_builtin_int(lpx_dtype d)
{
    return d == LPX_U8 || d == LPX_I8 || d == LPX_I32 || d == LPX_I64 || d == LPX_BOOL;
}

static void load_i64(lpx_dtype d, const void *src, int64_t *dst, size_t n)
{
    switch (d) {
    case LPX_U8: for (size_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i]; break;
    case LPX_I8: for (size_t i = 0; i < n; i++) dst[i] = ((const int8_t *)src)[i]; break;
    case LPX_I32: for (size_t i = 0; i < n; i++) dst[i] = ((const int32_t *)src)[i]; break;
    case LPX_I64: memcpy(dst, src, n * sizeof *dst); break;
    default: /* LPX_BOOL */
        for (size_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i] != 0;
        break;
    }
}

static int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void store_i64(lpx_dtype d, const int64_t *src, void *dst, size_t n)
{
    switch (d) {
    case LPX_U8:
        for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)clamp_i64(src[i], 0, UINT8_MAX);
        break;
    case LPX_I8:
        for (size_t i = 0; i < n; i++)
            ((int8_t *)dst)[i] = (int8_t)clamp_i64(src[i], INT8_MIN, INT8_MAX);
        break;
    case LPX_I32:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int32_t)clamp_i64(src[i], INT32_MIN, INT32_MAX);
        break;
    case LPX_I64: memcpy(dst, src, n * sizeof *src); break;
    default: /* LPX_BOOL */
        for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = src[i] != 0;
        break;
    }
}

/* i32/i64 -> f32 rounded to odd: the intermediate for non-f32 targets */
static void wide_int_to_f32_odd(lpx_dtype d, const void *src, float *dst, size_t n)
{
    if (d == LPX_I32) {
        const int32_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = lpx_i64_to_f32_odd(s[i]);
    } else {
        const int64_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = lpx_i64_to_f32_odd(s[i]);
    }
}

/* Convert n elements. Flags apply to cross-dtype conversions; a same-dtype
 * conversion is a bit copy. Errors also: LPX_EINVAL when dst and src
 * overlap (except dst == src with the same dtype, a no-op) or n is too
 * large to address. */
lpx_status lpx_convert(void *dst, lpx_dtype dst_dtype, const void *src, lpx_dtype src_dtype,
                       size_t n, unsigned flags)
{
    if (flags & ~LPX_CONVERT_SATURATE)
        return lpx_error(LPX_EINVAL,
                         "lpx_convert: unknown flags 0x%x (only LPX_CONVERT_SATURATE = 0x1 is defined)",
                         flags);
    const lpx_dtype_traits *dt = lpx_dtype_get(dst_dtype);
    const lpx_dtype_traits *st = lpx_dtype_get(src_dtype);
    if (!dt)
        return lpx_error(LPX_EDTYPE, "lpx_convert: dst_dtype %d is not a registered dtype",
                         (int)dst_dtype);
    if (!st)
        return lpx_error(LPX_EDTYPE, "lpx_convert: src_dtype %d is not a registered dtype",
                         (int)src_dtype);
    if (n == 0)
        return LPX_OK;
    if (!dst)
        return lpx_error(LPX_EINVAL, "lpx_convert: dst is NULL with n = %zu", n);
    if (!src)
        return lpx_error(LPX_EINVAL, "lpx_convert: src is NULL with n = %zu", n);
    if ((uint64_t)n > (uint64_t)INT64_MAX / 64u)
        return lpx_error(LPX_EINVAL, "lpx_convert: n = %zu is too large", n);
    size_t dbytes = lpx_dtype_nbytes(dst_dtype, (int64_t)n);
    size_t sbytes = lpx_dtype_nbytes(src_dtype, (int64_t)n);
    if (dbytes == SIZE_MAX || sbytes == SIZE_MAX)
        return lpx_error(LPX_EINVAL, "lpx_convert: n = %zu is too large", n);
    uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
    if (d0 < s0 + sbytes && s0 < d0 + dbytes) {
        if (dst == src && dst_dtype == src_dtype)
            return LPX_OK;
        return lpx_error(LPX_EINVAL, "lpx_convert: dst and src overlap (%s <- %s, n = %zu)",
                         dt->name, st->name, n);
    }

    if (dst_dtype == src_dtype) {
        memcpy(dst, src, dbytes);
        return LPX_OK;
    }
    if (src_dtype == LPX_F32) {
        dt->from_f32(src, dst, n, flags);
        return LPX_OK;
    }
    if (dst_dtype == LPX_F32) {
        st->to_f32(src, dst, n);
        if (SAT(flags) && st->is_float) {
            float *d = dst;
            BLOCKED_(n, d[i] = clamp_inf(d[i]));
        }
        return LPX_OK;
    }

    const unsigned char *s = src;
    unsigned char *d = dst;
    if (is_builtin_int(src_dtype) && is_builtin_int(dst_dtype)) {
        int64_t tmp[CHUNK];
        for (size_t i = 0; i < n; i += CHUNK) {
            size_t k = n - i < CHUNK ? n - i : CHUNK;
            load_i64(src_dtype, s + lpx_dtype__offset(st, i), tmp, k);
            store_i64(dst_dtype, tmp, d + lpx_dtype__offset(dt, i), k);
        }
        return LPX_OK;
    }

    bool wide = src_dtype == LPX_I32 || src_dtype == LPX_I64;
    float tmp[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        if (wide)
            wide_int_to_f32_odd(src_dtype, s + lpx_dtype__offset(st, i), tmp, k);
        else
            st->to_f32(s + lpx_dtype__offset(st, i), tmp, k);
        dt->from_f32(tmp, d + lpx_dtype__offset(dt, i), k, flags);
    }
    return LPX_OK;
}
