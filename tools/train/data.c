/* The character corpus and its batches.
 *
 * The corpus is a text file (data/corpus.txt by default); every distinct
 * byte is a token. The first 90% trains, the last 10% validates. A batch
 * is a set of windows at pseudo-random offsets that depend only on
 * (seed, step, micro-batch, row): every rank count sees the same data, so
 * --ranks 1 and --ranks N compute the same losses. */
#include <stdlib.h>
#include <string.h>
#include "train.h"

lpx_status tr_corpus_load(const char *path, tr_corpus *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) return lpx_error(LPX_EIO, "cannot open corpus '%s' (give one with --data FILE)", path);
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return lpx_error(LPX_ENOMEM, "out of memory reading '%s'", path);
    if (n < 4096) {
        free(buf);
        return lpx_error(LPX_EINVAL, "corpus '%s' has %zu bytes; at least 4096 are needed", path, n);
    }
    bool seen[256] = {false};
    for (size_t i = 0; i < n; i++) seen[buf[i]] = true;
    for (int b = 0; b < 256; b++)
        if (seen[b]) {
            c->id_of[b] = (uint8_t)c->vocab;
            c->char_of[c->vocab++] = (char)b;
        }
    for (size_t i = 0; i < n; i++) buf[i] = c->id_of[buf[i]];
    c->tok = buf;
    c->n = n;
    c->n_train = n * 9 / 10;
    return LPX_OK;
}

void tr_corpus_free(tr_corpus *c)
{
    free(c->tok);
    c->tok = NULL;
}

/* splitmix64: a stateless hash good enough to pick window offsets */
static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void tr_batch(const tr_corpus *c, uint64_t seed, int step, int chunk, bool val, int b, int seq, int32_t *idx,
              int32_t *tgt)
{
    size_t lo = val ? c->n_train : 0, hi = val ? c->n : c->n_train;
    size_t span = hi - lo - (size_t)seq - 1;
    for (int r = 0; r < b; r++) {
        uint64_t h = mix(seed ^ mix((uint64_t)step * 1000003u + (uint64_t)chunk * 7919u + (uint64_t)r +
                                    (val ? 0x5A5A5A5A00000000ull : 0)));
        size_t off = lo + (size_t)(h % span);
        for (int t = 0; t < seq; t++) {
            idx[r * seq + t] = c->tok[off + (size_t)t];
            tgt[r * seq + t] = c->tok[off + (size_t)t + 1];
        }
    }
}

uint64_t tr_rng_seed(uint64_t seed, int step, int chunk, int param)
{
    return mix(seed ^ mix(0xD2B74407B1CE6E93ull ^ mix((uint64_t)step * 1000003u + (uint64_t)chunk * 7919u +
                                                      ((uint64_t)param << 32))));
}

lpx_status tr_file_fnv(const char *path, uint64_t *hash, uint64_t *bytes)
{
    FILE *f = fopen(path, "rb");
    if (!f) return lpx_error(LPX_EIO, "cannot open '%s'", path);
    uint64_t h = 0xCBF29CE484222325ull, n = 0;
    unsigned char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < k; i++) h = (h ^ buf[i]) * 0x100000001B3ull;
        n += k;
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) return lpx_error(LPX_EIO, "cannot read '%s'", path);
    *hash = h;
    *bytes = n;
    return LPX_OK;
}
