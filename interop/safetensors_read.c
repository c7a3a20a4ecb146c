/* safetensors reading (include/lpx/safetensors.h; writing is
 * safetensors_write.c). JSON through cJSON (Debian libcjson-dev); the file
 * is memory-mapped and tensors are views of the mapping (from_blob with a
 * deleter dropping a mapping reference), so the file is unmapped after the
 * last tensor dies. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "lpx/lpx.h"
#include "lpx/safetensors.h"
#include "lpx/dlpack.h"
#include "core/lpx_internal.h"
#include "safetensors_internal.h"


/* ---- dtype names */

static const struct { const char *st; const char *lpx; } dtype_names[] = {
    {"F32", "f32"}, {"F16", "f16"}, {"BF16", "bf16"}, {"F8_E4M3", "f8e4m3fn"}, {"F8_E5M2", "f8e5m2"},
    {"U8", "u8"}, {"I8", "i8"}, {"I32", "i32"}, {"I64", "i64"}, {"BOOL", "bool"},
    {"F8_E8M0", "e8m0"}, {"F4", "f4e2m1"},
};
#define NDTYPE_NAMES (int)(sizeof dtype_names / sizeof dtype_names[0])

const char *lpx_safetensors_dtype_name(lpx_dtype d)
{
    const char *n = lpx_dtype_valid(d) ? lpx_dtype_name(d) : NULL;
    for (int i = 0; n && i < NDTYPE_NAMES; i++)
        if (!strcmp(dtype_names[i].lpx, n)) return dtype_names[i].st;
    return NULL;
}

lpx_dtype lpx__st_dtype_from_name(const char *st)
{
    for (int i = 0; i < NDTYPE_NAMES; i++)
        if (!strcmp(dtype_names[i].st, st)) return lpx_dtype_from_name(dtype_names[i].lpx);
    return -1;
}

/* ---- the mapping, shared by the file handle and every tensor from it */

typedef struct st_map {
    atomic_int refs;
    void *addr;
    size_t len;
} st_map;

static void map_unref(st_map *m)
{
    if (!m || atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1) return;
    if (m->addr) munmap(m->addr, m->len);
    lpx_free(m);
}

static void map_deleter(void *data, void *ctx)
{
    (void)data;
    map_unref(ctx);
}

typedef struct st_raw {
    char *name;
    lpx_dtype dtype;
    int ndim;
    int64_t shape[LPX_MAX_DIMS];
    uint64_t begin, end;
    int group;                 /* logical entry of a kind inner tensor, or -1 */
} st_raw;

typedef struct st_entry {
    char *name;
    char *kind;                /* "" for dense */
    int raw;                   /* dense: the raw entry */
    lpx_dtype dtype;
    int ndim;
    int64_t shape[LPX_MAX_DIMS];
    struct st_kind *k;         /* kind entries only (NULL for dense: keeps an entry small) */
} st_entry;

/* what a kind entry adds: its inner tensors and metadata */
typedef struct st_kind {
    int ninner;
    char inner_names[LPX_MAX_INNER][32];
    int inner_raw[LPX_MAX_INNER];
    size_t meta_size;
    unsigned char meta[LPX_MAX_META];
} st_kind;

struct lpx_safetensors {
    st_map *map;
    const unsigned char *data;  /* byte buffer after the header */
    uint64_t data_len;
    int nraw, nent, nmeta;
    st_raw *raw;
    st_entry *ent;
    char **mkey, **mval;
    char *path;
    int *ent_order;            /* entries by name (lookups by bsearch) */
    int *meta_order;           /* metadata keys by key */
};

void lpx_safetensors_close(lpx_safetensors *f)
{
    if (!f) return;
    for (int i = 0; i < f->nraw; i++) lpx_free(f->raw[i].name);
    for (int i = 0; i < f->nent; i++) {
        lpx_free(f->ent[i].name);
        lpx_free(f->ent[i].kind);
        lpx_free(f->ent[i].k);
    }
    for (int i = 0; i < f->nmeta; i++) {
        lpx_free(f->mkey[i]);
        lpx_free(f->mval[i]);
    }
    lpx_free(f->raw);
    lpx_free(f->ent);
    lpx_free(f->mkey);
    lpx_free(f->mval);
    lpx_free(f->ent_order);
    lpx_free(f->meta_order);
    lpx_free(f->path);
    map_unref(f->map);
    lpx_free(f);
}

/* ---- header parsing helpers */

/* A JSON integer in [0, 2^53) */
static bool json_uint(const cJSON *j, uint64_t *v)
{
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < MAX_EXACT_INT) || d != (double)(uint64_t)d) return false;
    *v = (uint64_t)d;
    return true;
}

static lpx_status parse_shape(const char *path, const char *name, const cJSON *js, int *ndim, int64_t *shape,
                              int64_t *numel)
{
    if (!cJSON_IsArray(js))
        return lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'shape' is missing or not an array", path, name);
    int n = cJSON_GetArraySize(js);
    if (n > LPX_MAX_DIMS)
        return lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'shape' has %d dims (lpx allows %d)",
                         path, name, n, LPX_MAX_DIMS);
    int64_t ne = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, js) {
        uint64_t v;
        if (!json_uint(d, &v))
            return lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'shape'[%d] is not a non-negative integer",
                             path, name, i);
        if (v && (uint64_t)ne > (uint64_t)INT64_MAX / 64 / v)
            return lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'shape' overflows (huge shape)", path, name);
        ne *= (int64_t)v;
        shape[i++] = (int64_t)v;
    }
    *ndim = n;
    *numel = ne;
    return LPX_OK;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* kind descriptor "N::kind" -> entry e */
static lpx_status parse_kind_desc(const char *path, const char *key, const char *val, st_entry *e)
{
    const char *sep = strstr(key, SEP);
    size_t nlen = (size_t)(sep - key);
    if (!nlen || strstr(sep + 2, SEP) || !sep[2])
        return lpx_error(LPX_EINVAL, "safetensors %s: __metadata__ key '%s' is not '<name>::<kind>'", path, key);
    lpx_status st = LPX_OK;
    cJSON *j = cJSON_Parse(val);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return lpx_error(LPX_EINVAL, "safetensors %s: __metadata__ '%s': value is not a JSON object", path, key);
    }
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(j, "inner");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "meta");
    int64_t numel;
    e->name = lpx_malloc(nlen + 1);
    e->kind = lpx_strdup(sep + 2);
    e->k = lpx_calloc(1, sizeof *e->k);
    if (!e->name || !e->kind || !e->k) { st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path); goto done; }
    memcpy(e->name, key, nlen);
    e->name[nlen] = 0;
    e->raw = -1;
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, e->kind)) {
        st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'kind' is missing or differs from the key", path, e->name);
        goto done;
    }
    if (!cJSON_IsString(dt) || (e->dtype = lpx_dtype_from_name(dt->valuestring)) < 0) {
        st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'dtype' is missing or unknown", path, e->name);
        goto done;
    }
    if ((st = parse_shape(path, e->name, cJSON_GetObjectItemCaseSensitive(j, "shape"), &e->ndim, e->shape, &numel)))
        goto done;
    if (!cJSON_IsArray(inner) || cJSON_GetArraySize(inner) > LPX_MAX_INNER) {
        st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'inner' is missing or has more than %d names",
                       path, e->name, LPX_MAX_INNER);
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, inner) {
        if (!cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) >= sizeof e->k->inner_names[0] ||
            strstr(it->valuestring, SEP)) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'inner'[%d] is not a valid name",
                           path, e->name, e->k->ninner);
            goto done;
        }
        for (int k = 0; k < e->k->ninner; k++)
            if (!strcmp(e->k->inner_names[k], it->valuestring)) {
                st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'inner' names '%s' twice",
                               path, e->name, it->valuestring);
                goto done;
            }
        e->k->inner_raw[e->k->ninner] = -1;
        snprintf(e->k->inner_names[e->k->ninner++], sizeof e->k->inner_names[0], "%s", it->valuestring);
    }
    if (!cJSON_IsString(meta) || strlen(meta->valuestring) % 2 || strlen(meta->valuestring) / 2 > LPX_MAX_META) {
        st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'meta' is missing, odd-length or longer "
                       "than %d bytes", path, e->name, LPX_MAX_META);
        goto done;
    }
    e->k->meta_size = strlen(meta->valuestring) / 2;
    for (size_t i = 0; i < e->k->meta_size; i++) {
        int hi = hexval(meta->valuestring[2 * i]), lo = hexval(meta->valuestring[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s': field 'meta' is not hex", path, e->name);
            goto done;
        }
        e->k->meta[i] = (unsigned char)(hi * 16 + lo);
    }
done:
    cJSON_Delete(j);
    return st;
}

static int cmp_raw_offset(const void *a, const void *b, void *ctx)
{
    const st_raw *r = ctx;
    const st_raw *x = &r[*(const int *)a], *y = &r[*(const int *)b];
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_names(const void *a, const void *b, void *ctx)
{
    const st_raw *r = ctx;
    return strcmp(r[*(const int *)a].name, r[*(const int *)b].name);
}

static int cmp_ent_names(const void *a, const void *b, void *ctx)
{
    const st_entry *e = ctx;
    return strcmp(e[*(const int *)a].name, e[*(const int *)b].name);
}

static int cmp_keys(const void *a, const void *b, void *ctx)
{
    char *const *k = ctx;
    return strcmp(k[*(const int *)a], k[*(const int *)b]);
}

/* 0..n-1 sorted by cmp(ctx): duplicates end up adjacent, and lookups
 * bisect (open is O(n log n) in the entry count, not O(n^2)) */
static int *sorted_index(int n, int (*cmp)(const void *, const void *, void *), void *ctx)
{
    int *o = lpx_calloc((size_t)n + 1, sizeof *o);
    if (!o) return NULL;
    for (int i = 0; i < n; i++) o[i] = i;
    qsort_r(o, (size_t)n, sizeof *o, cmp, ctx);
    return o;
}

/* the index in order[0..n) whose name (through get) equals key[0..len)
 * exactly, or -1 */
static int bisect(const int *order, int n, const char *key, size_t len, const char *(*get)(const void *, int),
                  const void *ctx)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const char *s = get(ctx, order[mid]);
        int c = strncmp(s, key, len);
        if (c == 0 && s[len]) c = 1;
        if (c == 0) return order[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static const char *ent_name_at(const void *ctx, int i) { return ((const st_entry *)ctx)[i].name; }
static const char *key_at(const void *ctx, int i) { return ((char *const *)ctx)[i]; }

/* ---- the header's top level, scanned without building its tree: each
 * member's value (a small object) is parsed with cJSON on its own and
 * freed, so opening a header of a million tensors holds one tensor's JSON
 * tree at a time, not the whole header's (memory O(header), not O(nodes)) */

typedef struct hdr_member {
    const char *key, *val;     /* spans in the header: the quoted key, the value */
    size_t key_len, val_len;
} hdr_member;

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* end of the JSON string starting at p ('"'), or NULL */
static const char *str_end(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\') {
            if (++p >= end) return NULL;
        } else if (*p == '"') {
            return p + 1;
        } else if ((unsigned char)*p < 0x20) {
            return NULL;
        }
    }
    return NULL;
}

/* end of the JSON value starting at p: a string, an object or array
 * (brackets counted outside strings; their grammar is cJSON's to check),
 * or a scalar; NULL when it does not end inside the header */
static const char *value_end(const char *p, const char *end)
{
    if (p >= end) return NULL;
    if (*p == '"') return str_end(p, end);
    if (*p == '{' || *p == '[') {
        long depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                if (!(p = str_end(p, end))) return NULL;
                continue;
            }
            if (c == '{' || c == '[') depth++;
            else if ((c == '}' || c == ']') && --depth == 0) return p + 1;
            p++;
        }
        return NULL;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && !is_ws(*p)) p++;
    return p;
}

/* The next member of the top-level object at *at (after '{' or ','):
 * 1 with *m filled, 0 at the closing '}', -1 on bad JSON (*at: where) */
static int next_member(const char **at, const char *end, bool first, hdr_member *m)
{
    const char *p = *at;
    while (p < end && is_ws(*p)) p++;
    if (p < end && *p == '}' && first) {
        *at = p + 1;
        return 0;
    }
    if (!first) {
        if (p < end && *p == '}') {
            *at = p + 1;
            return 0;
        }
        if (p >= end || *p != ',') goto bad;
        for (p++; p < end && is_ws(*p); p++) {}
    }
    if (p >= end || *p != '"') goto bad;
    const char *ke = str_end(p, end);
    if (!ke) goto bad;
    m->key = p;
    m->key_len = (size_t)(ke - p);
    for (p = ke; p < end && is_ws(*p); p++) {}
    if (p >= end || *p != ':') goto bad;
    for (p++; p < end && is_ws(*p); p++) {}
    const char *ve = value_end(p, end);
    if (!ve || ve == p) goto bad;
    m->val = p;
    m->val_len = (size_t)(ve - p);
    *at = ve;
    return 1;
bad:
    *at = p;
    return -1;
}

static lpx_status bad_json(const char *path, const char *hdr, const char *where)
{
    return lpx_error(LPX_EINVAL, "safetensors %s: the header is not valid JSON (near byte %zu)", path,
                     (size_t)(where - hdr));
}

/* the decoded key of m (cJSON decodes the escapes) into a new string */
static lpx_status member_key(const char *path, const char *hdr, const hdr_member *m, char **out)
{
    cJSON *k = cJSON_ParseWithLength(m->key, m->key_len);
    if (!cJSON_IsString(k)) {
        cJSON_Delete(k);
        return bad_json(path, hdr, m->key);
    }
    *out = lpx_strdup(k->valuestring);
    cJSON_Delete(k);
    return *out ? LPX_OK : lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
}

/* Counts the top-level members and finds __metadata__'s value (once). */
static lpx_status scan_top(const char *path, const char *hdr, size_t hlen, int *n, hdr_member *meta, bool *has_meta)
{
    const char *p = hdr, *end = hdr + hlen;
    while (p < end && is_ws(*p)) p++;
    if (p >= end || *p != '{') {
        cJSON *j = cJSON_ParseWithLength(hdr, hlen);   /* only to tell bad JSON from another value */
        bool valid = j != NULL;
        cJSON_Delete(j);
        return valid ? lpx_error(LPX_EINVAL, "safetensors %s: the header is not a JSON object", path)
                     : bad_json(path, hdr, p);
    }
    p++;
    *n = 0;
    *has_meta = false;
    hdr_member m;
    int r;
    for (bool first = true; (r = next_member(&p, end, first, &m)) == 1; first = false) {
        if (*n == INT32_MAX - 1) return lpx_error(LPX_EINVAL, "safetensors %s: too many entries", path);
        ++*n;
        if (m.key_len == 14 && !memcmp(m.key, "\"__metadata__\"", 14)) {
            if (*has_meta) return lpx_error(LPX_EINVAL, "safetensors %s: '__metadata__' appears twice", path);
            *has_meta = true;
            *meta = m;
        }
    }
    if (r < 0) return bad_json(path, hdr, p);
    while (p < end && is_ws(*p)) p++;
    if (p != end) return bad_json(path, hdr, p);
    return LPX_OK;
}

static lpx_status parse_header(lpx_safetensors *f, const char *hdr, size_t hlen)
{
    const char *path = f->path;
    int n = 0;
    hdr_member mm = {NULL, NULL, 0, 0};
    bool has_meta = false;
    lpx_status st = scan_top(path, hdr, hlen, &n, &mm, &has_meta);
    if (st) return st;
    cJSON *meta = NULL, *t = NULL;
    char *name = NULL;
    int *order = NULL, *kind_order = NULL;
    if (has_meta && !(meta = cJSON_ParseWithLength(mm.val, mm.val_len))) {
        st = bad_json(path, hdr, cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : mm.val);
        goto done;
    }
    int nm = meta ? cJSON_GetArraySize(meta) : 0;
    f->raw = lpx_calloc((size_t)n + 1, sizeof *f->raw);
    f->ent = lpx_calloc((size_t)n + (size_t)nm + 1, sizeof *f->ent);
    f->mkey = lpx_calloc((size_t)nm + 1, sizeof *f->mkey);
    f->mval = lpx_calloc((size_t)nm + 1, sizeof *f->mval);
    order = lpx_calloc((size_t)n + 1, sizeof *order);
    if (!f->raw || !f->ent || !f->mkey || !f->mval || !order) { st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path); goto done; }
    /* __metadata__: user strings and kind descriptors */
    if (meta) {
        if (!cJSON_IsObject(meta)) { st = lpx_error(LPX_EINVAL, "safetensors %s: '__metadata__' is not an object", path); goto done; }
        const cJSON *kv;
        cJSON_ArrayForEach(kv, meta) {
            if (!cJSON_IsString(kv)) {
                st = lpx_error(LPX_EINVAL, "safetensors %s: __metadata__ '%s' is not a string", path, kv->string);
                goto done;
            }
            if (strstr(kv->string, SEP)) {
                if ((st = parse_kind_desc(path, kv->string, kv->valuestring, &f->ent[f->nent]))) {
                    lpx_free(f->ent[f->nent].name);
                    lpx_free(f->ent[f->nent].kind);
                    lpx_free(f->ent[f->nent].k);
                    memset(&f->ent[f->nent], 0, sizeof f->ent[0]);
                    goto done;
                }
                f->nent++;
            } else {
                if (!(f->mkey[f->nmeta] = lpx_strdup(kv->string)) || !(f->mval[f->nmeta] = lpx_strdup(kv->valuestring))) {
                    lpx_free(f->mkey[f->nmeta]);
                    f->mkey[f->nmeta] = NULL;
                    st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
                    goto done;
                }
                f->nmeta++;
            }
        }
    }
    int nkinds = f->nent;
    /* repeated __metadata__ keys (the JSON object may repeat a key): user
     * keys among themselves, kind descriptors by tensor name */
    if (!(f->meta_order = sorted_index(f->nmeta, cmp_keys, f->mkey))) {
        st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
        goto done;
    }
    for (int i = 1; i < f->nmeta; i++)
        if (!strcmp(f->mkey[f->meta_order[i]], f->mkey[f->meta_order[i - 1]])) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: __metadata__ key '%s' appears twice", path,
                           f->mkey[f->meta_order[i]]);
            goto done;
        }
    kind_order = sorted_index(nkinds, cmp_ent_names, f->ent);
    if (!kind_order) {
        st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
        goto done;
    }
    for (int i = 1; i < nkinds; i++)
        if (!strcmp(f->ent[kind_order[i]].name, f->ent[kind_order[i - 1]].name)) {
            const st_entry *a = &f->ent[kind_order[i]], *b = &f->ent[kind_order[i - 1]];
            if (!strcmp(a->kind, b->kind))
                st = lpx_error(LPX_EINVAL, "safetensors %s: __metadata__ key '%s" SEP "%s' appears twice", path,
                               a->name, a->kind);
            else
                st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' appears twice (dense and kind, or two kinds)",
                               path, a->name);
            goto done;
        }
    /* tensors: one member at a time */
    const char *at = hdr;
    while (is_ws(*at)) at++;
    at++;   /* '{' (scan_top checked the grammar of the top level) */
    hdr_member m;
    for (bool first = true; next_member(&at, hdr + hlen, first, &m) == 1; first = false) {
        cJSON_Delete(t);
        lpx_free(name);
        t = NULL;
        name = NULL;
        if ((st = member_key(path, hdr, &m, &name))) goto done;
        if (!strcmp(name, "__metadata__")) {
            /* the one scan_top found, not a second one spelled with escapes */
            if (!has_meta || m.val != mm.val) {
                st = lpx_error(LPX_EINVAL, "safetensors %s: '__metadata__' appears twice", path);
                goto done;
            }
            continue;
        }
        if (!(t = cJSON_ParseWithLength(m.val, m.val_len))) {
            st = bad_json(path, hdr, cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : m.val);
            goto done;
        }
        st_raw *r = &f->raw[f->nraw];
        if (!name[0]) { st = lpx_error(LPX_EINVAL, "safetensors %s: a tensor has an empty name", path); goto done; }
        if (!cJSON_IsObject(t)) { st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' is not an object", path, name); goto done; }
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        if (!cJSON_IsString(dt)) { st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'dtype' is missing", path, name); goto done; }
        if ((r->dtype = lpx__st_dtype_from_name(dt->valuestring)) < 0) {
            st = lpx_error(LPX_EDTYPE, "safetensors %s: tensor '%s': field 'dtype' = '%s' is not supported", path, name,
                           dt->valuestring);
            goto done;
        }
        int64_t numel;
        if ((st = parse_shape(path, name, cJSON_GetObjectItemCaseSensitive(t, "shape"), &r->ndim, r->shape, &numel))) goto done;
        if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(cJSON_GetArrayItem(off, 0), &r->begin) ||
            !json_uint(cJSON_GetArrayItem(off, 1), &r->end)) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'data_offsets' is not [begin, end]", path, name);
            goto done;
        }
        if (r->begin > r->end || r->end > f->data_len) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'data_offsets' [%llu, %llu] is out of range "
                           "(%llu data bytes)", path, name, (unsigned long long)r->begin, (unsigned long long)r->end,
                           (unsigned long long)f->data_len);
            goto done;
        }
        uint64_t want = lpx_dtype_nbytes(r->dtype, numel);
        if (r->end - r->begin != want) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'data_offsets' spans %llu bytes, dtype %s and "
                           "shape need %llu", path, name, (unsigned long long)(r->end - r->begin), dt->valuestring,
                           (unsigned long long)want);
            goto done;
        }
        r->group = -1;
        if (!(r->name = lpx_strdup(name))) { st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path); goto done; }
        order[f->nraw] = f->nraw;
        f->nraw++;
        /* kind inner tensor "N::kind::inner" or dense */
        const char *sep = strstr(name, SEP);
        if (sep) {
            /* "N::kind::inner": the kind entry named N (a name holds no
             * "::"), by bisection */
            int g = -1, k = -1, i = bisect(kind_order, nkinds, name, (size_t)(sep - name), ent_name_at, f->ent);
            if (i >= 0) {
                size_t nl = (size_t)(sep - name), kl = strlen(f->ent[i].kind);
                if (!strncmp(name + nl + 2, f->ent[i].kind, kl) && !strncmp(name + nl + 2 + kl, SEP, 2))
                    for (int j = 0; j < f->ent[i].k->ninner; j++)
                        if (!strcmp(name + nl + 4 + kl, f->ent[i].k->inner_names[j])) { g = i; k = j; break; }
            }
            if (g < 0) {
                st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' looks like a kind inner tensor but no "
                               "__metadata__ kind entry lists it", path, name);
                goto done;
            }
            if (f->ent[g].k->inner_raw[k] >= 0) {
                st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' appears twice", path, name);
                goto done;
            }
            f->ent[g].k->inner_raw[k] = f->nraw - 1;
            r->group = g;
        } else {
            st_entry *e = &f->ent[f->nent];
            if (!(e->name = lpx_strdup(name)) || !(e->kind = lpx_strdup(""))) {
                lpx_free(e->name);   /* not counted in nent yet: close would not free it */
                e->name = NULL;
                st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
                goto done;
            }
            f->nent++;
            e->raw = f->nraw - 1;
            e->dtype = r->dtype;
            e->ndim = r->ndim;
            memcpy(e->shape, r->shape, sizeof e->shape);
        }
    }
    for (int i = 0; i < nkinds; i++)
        for (int j = 0; j < f->ent[i].k->ninner; j++)
            if (f->ent[i].k->inner_raw[j] < 0) {
                st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s' (%s): inner tensor '%s" SEP "%s" SEP "%s' is missing",
                               path, f->ent[i].name, f->ent[i].kind, f->ent[i].name, f->ent[i].kind, f->ent[i].k->inner_names[j]);
                goto done;
            }
    /* duplicate names (the JSON object may repeat a key), across dense and kind names */
    qsort_r(order, (size_t)f->nraw, sizeof *order, cmp_names, f->raw);
    for (int i = 1; i < f->nraw; i++)
        if (!strcmp(f->raw[order[i]].name, f->raw[order[i - 1]].name)) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' appears twice", path, f->raw[order[i]].name);
            goto done;
        }
    if (!(f->ent_order = sorted_index(f->nent, cmp_ent_names, f->ent))) {
        st = lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
        goto done;
    }
    for (int i = 1; i < f->nent; i++)
        if (!strcmp(f->ent[f->ent_order[i]].name, f->ent[f->ent_order[i - 1]].name)) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' appears twice (dense and kind, or two kinds)", path,
                           f->ent[f->ent_order[i]].name);
            goto done;
        }
    /* overlapping offsets */
    qsort_r(order, (size_t)f->nraw, sizeof *order, cmp_raw_offset, f->raw);
    uint64_t prev_end = 0;
    const char *prev = NULL;
    for (int i = 0; i < f->nraw; i++) {
        const st_raw *r = &f->raw[order[i]];
        if (r->begin == r->end) continue;
        if (prev && r->begin < prev_end) {
            st = lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s': field 'data_offsets' overlaps tensor '%s'", path,
                           r->name, prev);
            goto done;
        }
        prev_end = r->end;
        prev = r->name;
    }
done:
    lpx_free(order);
    lpx_free(kind_order);
    lpx_free(name);
    cJSON_Delete(t);
    cJSON_Delete(meta);
    return st;
}

lpx_status lpx_safetensors_open(const char *path, lpx_safetensors **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_safetensors_open: out is NULL");
    *out = NULL;
    if (!path) return lpx_error(LPX_EINVAL, "lpx_safetensors_open: path is NULL");
    /* O_NONBLOCK: a FIFO's open would wait for a writer; this way the
     * fstat below refuses it (mmap ignores the flag) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return lpx_error(LPX_EIO, "safetensors %s: open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return lpx_error(LPX_EIO, "safetensors %s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return lpx_error(LPX_EIO, "safetensors %s: not a regular file (a FIFO, socket, device or directory)", path);
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return lpx_error(LPX_EIO, "safetensors %s: truncated: %zu bytes, the header length alone takes 8", path, len);
    }
    st_map *m = lpx_calloc(1, sizeof *m);
    lpx_safetensors *f = lpx_calloc(1, sizeof *f);
    char *p = lpx_strdup(path);
    if (!m || !f || !p) {
        close(fd);
        lpx_free(m);
        lpx_free(f);
        lpx_free(p);
        return lpx_error(LPX_ENOMEM, "safetensors %s: out of memory", path);
    }
    atomic_init(&m->refs, 1);
    f->map = m;
    f->path = p;
    /* private + writable: copy-on-write, tensors may be trained in place */
    void *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (a == MAP_FAILED) {
        lpx_safetensors_close(f);
        return lpx_error(LPX_EIO, "safetensors %s: mmap: %s", path, strerror(e));
    }
    m->addr = a;
    m->len = len;
    uint64_t hlen = 0;
    const unsigned char *b = a;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > LPX_SAFETENSORS_MAX_HEADER) {
        lpx_safetensors_close(f);
        return lpx_error(LPX_EINVAL, "safetensors %s: header length %llu exceeds the limit of %u bytes", path,
                         (unsigned long long)hlen, LPX_SAFETENSORS_MAX_HEADER);
    }
    if (hlen > len - 8) {
        lpx_safetensors_close(f);
        return lpx_error(LPX_EIO, "safetensors %s: truncated: header length %llu runs past the end of the file "
                         "(%zu bytes)", path, (unsigned long long)hlen, len);
    }
    if (hlen < 2) {
        lpx_safetensors_close(f);
        return lpx_error(LPX_EINVAL, "safetensors %s: header length %llu is too short for a JSON object", path,
                         (unsigned long long)hlen);
    }
    f->data = b + 8 + hlen;
    f->data_len = len - 8 - hlen;
    if ((st = parse_header(f, (const char *)b + 8, (size_t)hlen))) {
        lpx_safetensors_close(f);
        return st;
    }
    *out = f;
    return LPX_OK;
}

int lpx_safetensors_count(const lpx_safetensors *f) { return f ? f->nent : 0; }

const char *lpx_safetensors_name(const lpx_safetensors *f, int i)
{
    return f && i >= 0 && i < f->nent ? f->ent[i].name : NULL;
}

static st_entry *find_entry(const lpx_safetensors *f, const char *name)
{
    if (!f || !name || !f->ent_order) return NULL;
    int i = bisect(f->ent_order, f->nent, name, strlen(name), ent_name_at, f->ent);
    return i >= 0 ? &f->ent[i] : NULL;
}

const char *lpx_safetensors_kind_of(const lpx_safetensors *f, const char *name)
{
    st_entry *e = find_entry(f, name);
    return e ? e->kind : NULL;
}

const char *lpx_safetensors_metadata(const lpx_safetensors *f, const char *key)
{
    if (!f || !key || !f->meta_order) return NULL;
    int i = bisect(f->meta_order, f->nmeta, key, strlen(key), key_at, f->mkey);
    return i >= 0 ? f->mval[i] : NULL;
}

int lpx_safetensors_metadata_count(const lpx_safetensors *f) { return f ? f->nmeta : 0; }

const char *lpx_safetensors_metadata_at(const lpx_safetensors *f, int i, const char **value)
{
    if (!f || i < 0 || i >= f->nmeta) {
        if (value) *value = NULL;
        return NULL;
    }
    if (value) *value = f->mval[i];
    return f->mkey[i];
}

/* a dense tensor of raw entry r: a view of the mapping when aligned */
static lpx_status get_raw(lpx_safetensors *f, const st_raw *r, lpx_tensor **out)
{
    const lpx_dtype_traits *tr = lpx_dtype_get(r->dtype);
    size_t esize = tr->bits >= 8 ? (size_t)tr->bits / 8 : 1;
    void *p = (void *)(f->data + r->begin);
    size_t nb = (size_t)(r->end - r->begin);
    if ((uintptr_t)p % esize == 0) {
        atomic_fetch_add_explicit(&f->map->refs, 1, memory_order_relaxed);
        lpx_status st = lpx_tensor_from_blob(nb ? p : NULL, r->dtype, r->ndim, r->shape, NULL, lpx_cpu(), map_deleter,
                                             f->map, out);
        if (st) map_unref(f->map);
        return st;
    }
    lpx_status st = lpx_tensor_new(r->dtype, r->ndim, r->shape, lpx_cpu(), out);
    if (st) return st;
    if (nb) memcpy(lpx_tensor_data(*out), p, nb);
    return LPX_OK;
}

lpx_status lpx_safetensors_get(lpx_safetensors *f, const char *name, lpx_tensor **out)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "lpx_safetensors_get: out is NULL");
    *out = NULL;
    if (!f || !name) return lpx_error(LPX_EINVAL, "lpx_safetensors_get: file or name is NULL");
    st_entry *e = find_entry(f, name);
    if (!e) return lpx_error(LPX_ENOTFOUND, "safetensors %s: no tensor '%s'", f->path, name);
    if (!e->kind[0]) return get_raw(f, &f->raw[e->raw], out);
    const lpx_kind *k;
    if (lpx_kind_find(e->kind, &k))
        return lpx_error(LPX_ENOTFOUND, "safetensors %s: tensor '%s' is of kind '%s', which is not registered "
                         "(plugin not loaded?)", f->path, name, e->kind);
    lpx_tensor *inner[LPX_MAX_INNER] = {0};
    for (int i = 0; i < e->k->ninner && !st; i++) {
        char want[32];
        lpx_kind_inner_name(k, i, want, sizeof want);
        if (strcmp(want, e->k->inner_names[i]))
            st = lpx_error(LPX_EINVAL, "safetensors %s: kind tensor '%s' (%s): inner tensor %d is '%s', the kind's is '%s'",
                           f->path, name, e->kind, i, e->k->inner_names[i], want);
        else
            st = get_raw(f, &f->raw[e->k->inner_raw[i]], &inner[i]);
    }
    if (!st) {
        st = lpx_kind_unflatten(k, e->dtype, e->ndim, e->shape, inner, e->k->ninner, e->k->meta, e->k->meta_size,
                                out);
        if (st) {
            char msg[700];
            snprintf(msg, sizeof msg, "%s", lpx_last_error());
            st = lpx_error(st, "safetensors %s: kind tensor '%s' (%s) refused: %s", f->path, name, e->kind, msg);
        }
    }
    for (int i = 0; i < e->k->ninner; i++) lpx_tensor_release(inner[i]);
    return st;
}

lpx_status lpx_safetensors_get_quantized(lpx_safetensors *f, const char *name, const lpx_kind *kind, lpx_tensor **out)
{
    if (!out) return lpx_error(LPX_EINVAL, "lpx_safetensors_get_quantized: out is NULL");
    *out = NULL;
    if (!kind) return lpx_error(LPX_EINVAL, "lpx_safetensors_get_quantized: kind is NULL");
    lpx_tensor *x = NULL;
    lpx_status st = lpx_safetensors_get(f, name, &x);
    if (st) return st;
    const lpx_kind *xk = lpx_tensor_kind(x);
    if (xk == kind) { *out = x; return LPX_OK; }
    if (xk) {
        lpx_tensor_release(x);
        return lpx_error(LPX_EINVAL, "safetensors %s: tensor '%s' is stored as kind '%s', not '%s'", f->path, name,
                         lpx_kind_name(xk), lpx_kind_name(kind));
    }
    const lpx_dtype_traits *tr = lpx_dtype_get(lpx_tensor_dtype(x));
    if (!tr->is_float) {
        lpx_tensor_release(x);
        return lpx_error(LPX_EDTYPE, "safetensors %s: tensor '%s' has dtype %s; quantizing to %s needs a float tensor",
                         f->path, name, tr->name, lpx_kind_name(kind));
    }
    st = lpx_kind_from_dense(kind, x, out);
    lpx_tensor_release(x);
    return st;
}
