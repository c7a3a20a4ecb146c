/* The model description shared by `lpx train`, `lpx eval` and `lpx mem`:
 * Llama 3 presets with the published shapes, the command-line overrides,
 * the one validator every source of a description goes through, and the
 * rotary frequencies exactly as transformers computes them. */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "train.h"

typedef struct preset {
    const char *name;
    tr_arch a;
} preset;

/* config.json of each model on the Hugging Face hub (meta-llama/...). The
 * 3.1 rope scaling (factor 8) for the 8B/70B/405B, 3.2's (factor 32) for
 * the small ones, which also tie the head to the embedding. */
#define LLAMA31_ROPE 500000.0, 1e-5, 8.0, 1.0, 4.0, 8192, 131072
#define LLAMA32_ROPE 500000.0, 1e-5, 32.0, 1.0, 4.0, 8192, 131072
static const preset presets[] = {
    {"llama3-8b", {128256, 4096, 32, 32, 8, 14336, false, LLAMA31_ROPE}},
    {"llama3-70b", {128256, 8192, 80, 64, 8, 28672, false, LLAMA31_ROPE}},
    {"llama3-405b", {128256, 16384, 126, 128, 8, 53248, false, LLAMA31_ROPE}},
    {"llama3.2-1b", {128256, 2048, 16, 32, 8, 8192, true, LLAMA32_ROPE}},
    {"llama3.2-3b", {128256, 3072, 28, 24, 8, 8192, true, LLAMA32_ROPE}},
    /* the CPU demo: bytes of the shipped corpus, GQA (2 query heads per
     * k/v head), the rope of Llama 3 without the long-context scaling */
    {"tiny", {256, 128, 2, 4, 2, 352, false, 500000.0, 1e-5, 0, 0, 0, 0, 0}},
};

bool tr_arch_preset(const char *name, tr_arch *a)
{
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcmp(name, presets[i].name)) {
            *a = presets[i].a;
            return true;
        }
    return false;
}

const char *tr_arch_preset_names(void)
{
    return "llama3-8b, llama3-70b, llama3-405b, llama3.2-1b, llama3.2-3b, tiny";
}

static int fail(const char *who, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const char *who, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", who);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int tr_arch_check(const tr_arch *a, const char *who)
{
    if (a->dim < 2) return fail(who, "--dim %d: at least 2", a->dim);
    if (a->heads < 1 || a->dim % a->heads)
        return fail(who, "--dim %d is not divisible by --heads %d", a->dim, a->heads);
    if ((a->dim / a->heads) % 2) return fail(who, "head dim %d (--dim / --heads) is odd; rope rotates pairs", a->dim / a->heads);
    if (a->kv_heads < 1 || a->heads % a->kv_heads)
        return fail(who, "--heads %d is not a multiple of --kv-heads %d", a->heads, a->kv_heads);
    if (a->ffn < 1) return fail(who, "--ffn %d: at least 1", a->ffn);
    if (a->layers < 1) return fail(who, "--layers %d: at least one block", a->layers);
    if (a->vocab < 0 || a->vocab == 1) return fail(who, "--vocab %d: at least 2 tokens", a->vocab);
    if (!(a->rope_theta > 1) || !isfinite(a->rope_theta))
        return fail(who, "--rope-theta %g must be a finite number > 1", a->rope_theta);
    if (!(a->norm_eps > 0) || a->norm_eps >= 1) return fail(who, "rms_norm_eps %g must lie in (0, 1)", a->norm_eps);
    if (a->rope_factor != 0 &&
        !(a->rope_factor >= 1 && a->rope_low > 0 && a->rope_high > a->rope_low && a->rope_orig > 0))
        return fail(who, "rope scaling (llama3): factor %g, low_freq_factor %g, high_freq_factor %g, "
                         "original_max_position_embeddings %d: expected factor >= 1 and 0 < low < high",
                    a->rope_factor, a->rope_low, a->rope_high, a->rope_orig);
    return 0;
}

static int int_of(const char *who, const char *opt, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        return fail(who, "%s '%s': expected an integer in %ld..%ld", opt, v, lo, hi);
    *out = (int)x;
    return 0;
}

int tr_arch_option(const char *who, const char *opt, const char *v, tr_arch *a, unsigned *given)
{
    int rc = 0;
    if (!strcmp(opt, "--model")) {
        if (!tr_arch_preset(v, a)) return fail(who, "unknown --model '%s' (%s)", v, tr_arch_preset_names());
        *given |= TR_GIVEN_MODEL;
    } else if (!strcmp(opt, "--tied")) {
        a->tied = true;
        *given |= TR_GIVEN_TIED;
    } else if (!strcmp(opt, "--dim")) {
        rc = int_of(who, opt, v, 2, 1 << 17, &a->dim);
        *given |= TR_GIVEN_DIM;
    } else if (!strcmp(opt, "--layers")) {
        rc = int_of(who, opt, v, 1, 100000, &a->layers);
        *given |= TR_GIVEN_LAYERS;
    } else if (!strcmp(opt, "--heads")) {
        rc = int_of(who, opt, v, 1, 4096, &a->heads);
        *given |= TR_GIVEN_HEADS;
    } else if (!strcmp(opt, "--kv-heads")) {
        rc = int_of(who, opt, v, 1, 4096, &a->kv_heads);
        *given |= TR_GIVEN_KV_HEADS;
    } else if (!strcmp(opt, "--ffn")) {
        rc = int_of(who, opt, v, 1, 1 << 20, &a->ffn);
        *given |= TR_GIVEN_FFN;
    } else if (!strcmp(opt, "--vocab")) {
        rc = int_of(who, opt, v, 2, 1 << 24, &a->vocab);
        *given |= TR_GIVEN_VOCAB;
    } else if (!strcmp(opt, "--rope-theta")) {
        char *end;
        a->rope_theta = strtod(v, &end);
        if (*end || end == v || !(a->rope_theta > 1) || !isfinite(a->rope_theta))
            return fail(who, "--rope-theta '%s': expected a number > 1", v);
        *given |= TR_GIVEN_ROPE_THETA;
    } else {
        return 1;
    }
    return rc;
}

void tr_arch_finish(tr_arch *a, unsigned given)
{
    if ((given & TR_GIVEN_DIM) && !(given & TR_GIVEN_FFN)) a->ffn = (8 * a->dim / 3 + 31) / 32 * 32;
}

void tr_arch_inv_freq(const tr_arch *a, float *out)
{
    /* transformers (modeling_rope_utils): inv_freq = 1 / theta^(arange(0,
     * hd, 2) / hd), all in f32; then _compute_llama3_parameters */
    int hd = a->dim / a->heads, half = hd / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)hd;
        out[i] = 1.0f / powf((float)a->rope_theta, e);
    }
    if (a->rope_factor == 0) return;
    float factor = (float)a->rope_factor, low = (float)a->rope_low, high = (float)a->rope_high;
    float old = (float)a->rope_orig, low_wl = old / low, high_wl = old / high;
    for (int i = 0; i < half; i++) {
        float f = out[i], wl = 2.0f * (float)M_PI / f;
        float scaled = wl > low_wl ? f / factor : f;
        float smooth = (old / wl - low) / (high - low);
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        bool medium = !(wl < high_wl) && !(wl > low_wl);
        out[i] = medium ? smoothed : scaled;
    }
}

int64_t tr_arch_params(const tr_arch *a)
{
    int64_t D = a->dim, kv = (int64_t)a->kv_heads * (D / a->heads), F = a->ffn, V = a->vocab;
    int64_t block = 2 * D + D * D * 2 + 2 * D * kv + 3 * D * F;
    return V * D * (a->tied ? 1 : 2) + D + block * a->layers;
}
