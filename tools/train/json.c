/* Reading fields of the JSON lpx train trusts only after checking: the
 * checkpoint record (ckpt.c, ckpt_v2.c) and Hugging Face's config.json
 * and shard index (hf_read.c). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "train.h"

bool tr_json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= (double)lo && j->valuedouble <= (double)hi) ||
        j->valuedouble != floor(j->valuedouble))
        return false;
    *out = (int64_t)j->valuedouble;
    return true;
}

const char *tr_json_str(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

char *tr_hex64(uint64_t v, char *buf)
{
    snprintf(buf, 17, "%016" PRIx64, v);
    return buf;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the first key that an object under j (j itself included) holds twice, or
 * NULL; *bad is set when out of memory */
static const char *duplicate_key(const cJSON *j, bool *bad)
{
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, j) {
        const char *d = duplicate_key(c, bad);
        if (d || *bad) return d;
        n++;
    }
    if (!cJSON_IsObject(j) || n < 2) return NULL;
    /* sorted, not pairwise: a weight_map has thousands of keys */
    const char **keys = malloc(sizeof *keys * (size_t)n), *dup = NULL;
    if (!keys) {
        *bad = true;
        return NULL;
    }
    n = 0;
    cJSON_ArrayForEach(c, j) keys[n++] = c->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_str);
    for (int i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
    free(keys);
    return dup;
}

lpx_status tr_json_read(const char *path, cJSON **out)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    lpx_status st = tr_read_regular(path, 64u << 20, &text, &len);
    if (st) return st;
    cJSON *root = NULL;
    const char *end = NULL;
    bool oom = false;
    /* Python's json (which transformers reads with) refuses a byte-order
     * mark; cJSON would skip it */
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3))
        FAIL(LPX_EINVAL, "%s starts with a UTF-8 byte-order mark, which Python's json.load refuses: save it without "
             "one", path);
    if (strlen(text) != len) FAIL(LPX_EINVAL, "%s holds a NUL byte at offset %zu: not JSON text", path, strlen(text));
    root = cJSON_ParseWithOpts(text, &end, false);
    if (!root)   /* end: where the parse failed (cJSON's global error pointer is not per thread) */
        FAIL(LPX_EINVAL, "%s is not valid JSON (at byte %lld)", path, end ? (long long)(end - text) : -1LL);
    /* what follows the value: white space only (json.load: "Extra data") */
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
    if (*end) FAIL(LPX_EINVAL, "%s has data after its JSON value (at byte %lld)", path, (long long)(end - text));
    if (!cJSON_IsObject(root)) FAIL(LPX_EINVAL, "%s is not a JSON object", path);
    /* Python keeps a repeated key's last value, cJSON finds its first:
     * refused rather than read differently */
    const char *dup = duplicate_key(root, &oom);
    if (oom) FAIL(LPX_ENOMEM, "%s: out of memory", path);
    if (dup) FAIL(LPX_EINVAL, "%s has the key \"%s\" twice in one object; lpx refuses a repeated key", path, dup);
    *out = root;
    root = NULL;
out:
    cJSON_Delete(root);
    free(text);
    return st;
}
