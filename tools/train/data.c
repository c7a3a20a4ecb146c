/* The corpus and its batches.
 *
 * A text file (data/corpus.txt by default) is read as bytes: every byte is
 * a token (vocab 256), so any text works and a byte-level model needs no
 * tokenizer. A FILE.bin holds pre-tokenized ids, little-endian u16 or u32
 * (nanoGPT's and torchtitan's convention), for real vocabularies. The
 * first 90% trains, the last 10% validates. A batch is a set of windows at
 * pseudo-random offsets that depend only on (seed, step, micro-batch,
 * row): every rank count sees the same data, so --ranks 1 and --ranks N
 * compute the same losses. */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "train.h"
#include "mem.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* the rest of stream f (at most max bytes) into a new NUL-terminated buffer;
 * closes f */
static lpx_status read_stream(FILE *f, const char *path, size_t max, char **out, size_t *len)
{
    /* grown as it reads: pipes and files alike, no size asked up front */
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    lpx_status st = LPX_OK;
    while (buf && !st) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (n > max) st = lpx_error(LPX_EINVAL, "'%s' is larger than %zu bytes", path, max);
        else if (k == 0) break;
        else if (n == cap) {
            char *nb = cap > (SIZE_MAX - 1) / 2 ? NULL : realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f) != 0;
    fclose(f);
    if (!buf) return lpx_error(LPX_ENOMEM, "out of memory reading '%s'", path);
    if (!st && err) st = lpx_error(LPX_EIO, "cannot read '%s'", path);
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return LPX_OK;
}

lpx_status tr_read_file(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return lpx_error(LPX_EINVAL, "'%s' is a directory", path);
    /* a regular file, or a pipe (a corpus streamed in); a device such as
     * /dev/zero never ends: refused */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISFIFO(sb.st_mode))
        return lpx_error(LPX_EIO, "'%s' is a %s, not a file or a pipe", path,
                         S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "device" : "socket");
    /* a stream is read up to half of the memory this process may take
     * (a pipe from an endless producer is refused, not read until the
     * machine runs out) */
    if (stat(path, &sb) == 0 && S_ISFIFO(sb.st_mode)) {
        tr_host_mem hm;
        tr_host_mem_read(&hm);
        double cap = isfinite(hm.avail) ? hm.avail / 2 : (double)((size_t)1 << 40);
        if (cap < (double)max) max = cap < 1 ? 1 : (size_t)cap;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return lpx_error(errno == ENOENT ? LPX_ENOTFOUND : LPX_EIO, "cannot open '%s': %s", path, strerror(errno));
    return read_stream(f, path, max, out, len);
}

lpx_status tr_read_regular(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading waits for a writer; this way
     * the open returns and fstat says what the path is */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return lpx_error(errno == ENOENT ? LPX_ENOTFOUND : LPX_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return lpx_error(LPX_EIO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        if (S_ISDIR(sb.st_mode)) return lpx_error(LPX_EINVAL, "'%s' is a directory", path);
        return lpx_error(LPX_EINVAL, "'%s' is not a regular file (a FIFO, socket or device)", path);
    }
    FILE *f = NULL;
    int fl = fcntl(fd, F_GETFL);
    if (fl == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1 || !(f = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return lpx_error(LPX_EIO, "cannot open '%s': %s", path, strerror(e));
    }
    return read_stream(f, path, max, out, len);
}

lpx_status tr_token_ids(const unsigned char *b, size_t n, int width, int vocab, const char *what, uint32_t *out)
{
    for (size_t i = 0; i < n; i++, b += width) {
        uint32_t id = width == 1 ? b[0] : width == 2 ? (uint32_t)(b[0] | b[1] << 8)
                                                     : (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                                           (uint32_t)b[3] << 24;
        if (id >= (uint32_t)vocab)
            return lpx_error(LPX_ERANGE, "%s: token id %u at position %zu is past the vocabulary (%d)", what, id, i,
                             vocab);
        out[i] = id;
    }
    return LPX_OK;
}

lpx_status tr_corpus_load(const char *path, int vocab, const char *dtype, tr_corpus *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", path);
    bool ids = ends_with(path, ".bin");
    if (ids && vocab <= 0)
        return lpx_error(LPX_EINVAL, "corpus '%s' holds token ids: give the model's vocabulary (--vocab, --model or "
                         "--init)", path);
    int width = !ids ? 1 : dtype ? (!strcmp(dtype, "u32") ? 4 : 2) : vocab > 65536 ? 4 : 2;
    if (!ids && vocab <= 0) vocab = 256;
    if (width == 2 && vocab > 65536)
        return lpx_error(LPX_EINVAL, "corpus '%s': u16 ids cannot address a vocabulary of %d (--data-dtype u32)",
                         path, vocab);
    char *buf = NULL;
    size_t bytes = 0;
    lpx_status st = tr_read_file(path, SIZE_MAX - 1, &buf, &bytes);
    if (st == LPX_EINVAL) return lpx_error(st, "corpus '%s' is a directory (give a file with --data)", path);
    if (st == LPX_ENOTFOUND) return lpx_error(LPX_EIO, "cannot open corpus '%s' (give one with --data FILE)", path);
    if (st) return st;
    size_t n = bytes / (size_t)width;
    if (bytes % (size_t)width) {
        free(buf);
        return lpx_error(LPX_EINVAL, "corpus '%s' has %zu bytes, not a whole number of u%d ids", path, bytes, 8 * width);
    }
    if (n < 4096) {
        free(buf);
        return lpx_error(LPX_EINVAL, "corpus '%s' has %zu tokens; at least 4096 are needed", path, n);
    }
    uint32_t *tok = malloc(n * sizeof *tok);
    if (!tok) {
        free(buf);
        return lpx_error(LPX_ENOMEM, "out of memory for the %zu tokens of '%s'", n, path);
    }
    char what[600];
    snprintf(what, sizeof what, "corpus '%s'", path);
    st = tr_token_ids((const unsigned char *)buf, n, width, vocab, what, tok);
    free(buf);
    if (st) {
        free(tok);
        return st;
    }
    c->tok = tok;
    c->n = n;
    c->n_train = n * 9 / 10;
    c->vocab = vocab;
    c->bytes = !ids;
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
            idx[r * seq + t] = (int32_t)c->tok[off + (size_t)t];
            tgt[r * seq + t] = (int32_t)c->tok[off + (size_t)t + 1];
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
