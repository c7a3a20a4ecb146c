/* Delayed scaling (the TransformerEngine recipe): a caller-owned amax
 * history per tensor, the scale derived from it, and a versioned blob to
 * save and restore the state with the rest of a checkpoint.
 *
 * Semantics per update(amax), matching TE's amax_history[0] = amax;
 * reduce; roll: the amax becomes the newest entry of a window of
 * `history_len` amaxes (the oldest drops out; the window starts as zeros);
 * on every interval-th update a = max(window) or the newest amax, and
 * scale = fp8_max / a / 2^margin unless a is 0 or not finite (NaN and inf
 * propagate through max, so they keep the previous scale until they leave
 * the window). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "float8_internal.h"

#define HIST_MAX (1 << 20)
#define MARGIN_MAX 127

struct lpx_float8_delayed {
    lpx_float8_delayed_config cfg;  /* defaults resolved */
    float *hist;                    /* ring of cfg.history_len */
    int head;                       /* slot of the next amax */
    int64_t steps;
    float scale;
};

static lpx_status resolve(const char *what, const lpx_float8_delayed_config *in, lpx_float8_delayed_config *out)
{
    lpx_float8_delayed_config c;
    memset(&c, 0, sizeof c);
    if (in) c = *in;
    if (c.history_len == 0) c.history_len = 1024;
    if (c.interval == 0) c.interval = 1;
    if (c.fp8 == 0) c.fp8 = LPX_F8E4M3FN;
    if (c.history_len < 1 || c.history_len > HIST_MAX)
        return lpx_error(LPX_EINVAL, "%s: history_len %d out of range 1..%d", what, c.history_len, HIST_MAX);
    if (c.algo != LPX_FLOAT8_AMAX_MAX && c.algo != LPX_FLOAT8_AMAX_MOST_RECENT)
        return lpx_error(LPX_EINVAL, "%s: algo %d is not max (0) or most_recent (1)", what, c.algo);
    if (c.margin < 0 || c.margin > MARGIN_MAX)
        return lpx_error(LPX_EINVAL, "%s: margin %d out of range 0..%d", what, c.margin, MARGIN_MAX);
    if (c.interval < 1) return lpx_error(LPX_EINVAL, "%s: interval %d must be >= 1", what, c.interval);
    if (!f8_is_fp8(c.fp8))
        return lpx_error(LPX_EDTYPE, "%s: fp8 is %s; delayed scaling is for f8e4m3fn or f8e5m2", what,
                         lpx_dtype_name(c.fp8));
    *out = c;
    return LPX_OK;
}

lpx_status lpx_float8_delayed_new(const lpx_float8_delayed_config *cfg, lpx_float8_delayed **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_float8_delayed_new: out is NULL");
    *out = NULL;
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    lpx_float8_delayed_config c;
    if ((st = resolve("lpx_float8_delayed_new", cfg, &c))) return st;
    lpx_float8_delayed *d = lpx_calloc(1, sizeof *d);
    float *h = lpx_calloc((size_t)c.history_len, sizeof *h);
    if (!d || !h) {
        lpx_free(d);
        lpx_free(h);
        return lpx_error(LPX_ENOMEM, "lpx_float8_delayed_new: cannot allocate a history of %d", c.history_len);
    }
    d->cfg = c;
    d->hist = h;
    d->scale = 1.0f;
    *out = d;
    return LPX_OK;
}

void lpx_float8_delayed_free(lpx_float8_delayed *d)
{
    if (!d) return;
    lpx_free(d->hist);
    lpx_free(d);
}

lpx_status lpx_float8_delayed_update(lpx_float8_delayed *d, double amax)
{
    if (!d) return lpx_error(LPX_EINVAL, "lpx_float8_delayed_update: state is NULL");
    if (amax < 0) return lpx_error(LPX_EINVAL, "lpx_float8_delayed_update: amax %g is negative", amax);
    int len = d->cfg.history_len;
    d->hist[d->head] = (float)amax;
    int newest = d->head;
    d->head = (d->head + 1) % len;
    d->steps++;
    if (d->steps % d->cfg.interval) return LPX_OK;
    double a;
    if (d->cfg.algo == LPX_FLOAT8_AMAX_MOST_RECENT) {
        a = d->hist[newest];
    } else {
        a = 0;
        for (int i = 0; i < len; i++) {
            double v = d->hist[i];
            if (isnan(v) || isnan(a)) a = NAN;
            else if (v > a) a = v;
        }
    }
    if (a > 0 && isfinite(a)) {
        double fmax = lpx_dtype_get(d->cfg.fp8)->max;
        double s = fmax / a / ldexp(1.0, d->cfg.margin);
        /* keep a usable f32 scale: a tiny amax must not give inf */
        if (s > FLT_MAX) s = FLT_MAX;
        if (s < FLT_MIN) s = FLT_MIN;
        d->scale = (float)s;
    }
    return LPX_OK;
}

float lpx_float8_delayed_scale(const lpx_float8_delayed *d) { return d ? d->scale : 0.0f; }
int64_t lpx_float8_delayed_steps(const lpx_float8_delayed *d) { return d ? d->steps : 0; }

lpx_status lpx_float8_delayed_get_config(const lpx_float8_delayed *d, lpx_float8_delayed_config *cfg)
{
    if (!d || !cfg) return lpx_error(LPX_EINVAL, "lpx_float8_delayed_get_config: NULL argument");
    *cfg = d->cfg;
    return LPX_OK;
}

int lpx_float8_delayed_history(const lpx_float8_delayed *d, float *out, int cap)
{
    if (!d || !out || cap <= 0) return 0;
    int len = d->cfg.history_len, n = cap < len ? cap : len;
    for (int i = 0; i < n; i++) out[i] = d->hist[((d->head - 1 - i) % len + len) % len];
    return n;
}

/* ---- save / load ---------------------------------------------------- */

/* Blob (little-endian): "LPXF8DS1", u32 version, u32 history_len,
 * i32 algo, i32 margin, i32 interval, i32 fp8, i64 steps, f32 scale,
 * then history_len f32 amaxes, newest first. */
static const char blob_magic[8] = {'L', 'P', 'X', 'F', '8', 'D', 'S', '1'};
#define BLOB_VERSION 1u
#define BLOB_HEADER (8 + 4 * 6 + 8 + 4)

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

lpx_status lpx_float8_delayed_save(const lpx_float8_delayed *d, void *buf, size_t cap, size_t *size)
{
    if (!d || !size) return lpx_error(LPX_EINVAL, "lpx_float8_delayed_save: %s is NULL", d ? "size" : "state");
    size_t need = BLOB_HEADER + 4u * (size_t)d->cfg.history_len;
    *size = need;
    if (!buf && cap == 0) return LPX_OK;
    if (!buf || cap < need)
        return lpx_error(LPX_ERANGE, "lpx_float8_delayed_save: the blob needs %zu bytes, buffer has %zu", need,
                         buf ? cap : 0);
    unsigned char *p = buf;
    memcpy(p, blob_magic, 8);
    put32(p + 8, BLOB_VERSION);
    put32(p + 12, (uint32_t)d->cfg.history_len);
    put32(p + 16, (uint32_t)d->cfg.algo);
    put32(p + 20, (uint32_t)d->cfg.margin);
    put32(p + 24, (uint32_t)d->cfg.interval);
    put32(p + 28, (uint32_t)d->cfg.fp8);
    put32(p + 32, (uint32_t)((uint64_t)d->steps & 0xFFFFFFFFu));
    put32(p + 36, (uint32_t)((uint64_t)d->steps >> 32));
    put32(p + 40, lpx_f32_bits(d->scale));
    float *h = lpx_malloc((size_t)d->cfg.history_len * sizeof *h);
    if (!h) return lpx_error(LPX_ENOMEM, "lpx_float8_delayed_save: cannot allocate %d floats", d->cfg.history_len);
    int n = lpx_float8_delayed_history(d, h, d->cfg.history_len);
    for (int i = 0; i < n; i++) put32(p + BLOB_HEADER + 4 * (size_t)i, lpx_f32_bits(h[i]));
    lpx_free(h);
    return LPX_OK;
}

lpx_status lpx_float8_delayed_load(lpx_float8_delayed *d, const void *buf, size_t size)
{
    const char *what = "lpx_float8_delayed_load";
    if (!d || !buf) return lpx_error(LPX_EINVAL, "%s: %s is NULL", what, d ? "buf" : "state");
    const unsigned char *p = buf;
    if (size < BLOB_HEADER) return lpx_error(LPX_EINVAL, "%s: blob of %zu bytes is shorter than its header", what, size);
    if (memcmp(p, blob_magic, 8)) return lpx_error(LPX_EINVAL, "%s: not a delayed-scaling blob (bad magic)", what);
    if (get32(p + 8) != BLOB_VERSION)
        return lpx_error(LPX_EINVAL, "%s: blob version %u, this library reads %u", what, get32(p + 8), BLOB_VERSION);
    lpx_float8_delayed_config c;
    uint32_t len = get32(p + 12);
    if (len < 1 || len > HIST_MAX)
        return lpx_error(LPX_EINVAL, "%s: history_len %u out of range 1..%d", what, len, HIST_MAX);
    c.history_len = (int)len;
    c.algo = (int32_t)get32(p + 16);
    c.margin = (int32_t)get32(p + 20);
    c.interval = (int32_t)get32(p + 24);
    c.fp8 = (int32_t)get32(p + 28);
    lpx_status st;
    if (c.fp8 == 0 || c.interval == 0)
        return lpx_error(LPX_EINVAL, "%s: blob has fp8 %d / interval %d; both must be set", what, (int)c.fp8, c.interval);
    if ((st = resolve(what, &c, &c))) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        return lpx_error(LPX_EINVAL, "%s", msg);
    }
    uint64_t steps = (uint64_t)get32(p + 32) | (uint64_t)get32(p + 36) << 32;
    if (steps > (uint64_t)INT64_MAX) return lpx_error(LPX_EINVAL, "%s: step count out of range", what);
    float scale = lpx_f32_from_bits(get32(p + 40));
    if (!(scale > 0) || !isfinite(scale))
        return lpx_error(LPX_EINVAL, "%s: scale %g must be finite and > 0", what, (double)scale);
    size_t need = BLOB_HEADER + 4u * (size_t)len;
    if (size != need) return lpx_error(LPX_EINVAL, "%s: blob is %zu bytes, its header says %zu", what, size, need);
    float *h = lpx_malloc((size_t)len * sizeof *h);
    if (!h) return lpx_error(LPX_ENOMEM, "%s: cannot allocate a history of %u", what, len);
    for (uint32_t i = 0; i < len; i++) {
        /* stored newest first; the ring's newest slot is len - 1, head 0 */
        float v = lpx_f32_from_bits(get32(p + BLOB_HEADER + 4 * (size_t)i));
        if (v < 0 || (v == 0 && signbit(v))) {
            lpx_free(h);
            return lpx_error(LPX_EINVAL, "%s: history[%u] = %g; amaxes are >= 0 (NaN and inf are kept)", what, i,
                             (double)v);
        }
        h[len - 1 - i] = v;
    }
    lpx_free(d->hist);
    d->hist = h;
    d->head = 0;
    d->cfg = c;
    d->steps = (int64_t)steps;
    d->scale = scale;
    return LPX_OK;
}
