/* Schema strings: "add(Tensor a, Tensor b, Tensor? out) -> Tensor".
 * Parsed once at registration into tags the hot path compares. */
#include <ctype.h>
#include <string.h>
#include "dispatch_internal.h"

/* Tensor(host): a tensor that may stay in host memory while the call's
 * other tensors live on a device (a static fp8 scale read on the host):
 * the dispatcher's one-device rule skips it when it is on the CPU. */
static const struct { const char *name; uint8_t tag; bool optional, host; } type_names[] = {
    {"Tensor(host)?", LPX_TAG_TENSOR, true, true}, {"Tensor(host)", LPX_TAG_TENSOR, false, true},
    {"Tensor?", LPX_TAG_TENSOR, true, false}, {"Tensor[]", LPX_TAG_TENSORS, false, false},
    {"Tensor", LPX_TAG_TENSOR, false, false}, {"int[]?", LPX_TAG_INTS, true, false},
    {"int[]", LPX_TAG_INTS, false, false},    {"int?", LPX_TAG_I64, true, false},
    {"int", LPX_TAG_I64, false, false},       {"float?", LPX_TAG_F64, true, false},
    {"float", LPX_TAG_F64, false, false},     {"bool", LPX_TAG_BOOL, false, false},
    {"dtype?", LPX_TAG_DTYPE, true, false},   {"dtype", LPX_TAG_DTYPE, false, false},
    {"str?", LPX_TAG_STR, true, false},       {"str", LPX_TAG_STR, false, false},
    {"ptr", LPX_TAG_PTR, false, false},       {"device", LPX_TAG_DEVICE, false, false},
};

static const char *skip_ws(const char *p)
{
    while (*p && isspace((unsigned char)*p)) p++;
    return p;
}

/* Reads a type token at p; returns the end or NULL. */
static const char *parse_type(const char *p, uint8_t *tag, bool *optional, bool *host)
{
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++) {
        size_t n = strlen(type_names[i].name);
        if (strncmp(p, type_names[i].name, n) == 0 && !isalnum((unsigned char)p[n]) && p[n] != '_' &&
            p[n] != '?' && p[n] != '[') {
            *tag = type_names[i].tag;
            *optional = type_names[i].optional;
            *host = type_names[i].host;
            return p + n;
        }
    }
    return NULL;
}

static const char *parse_ident(const char *p, char *dst)
{
    size_t n = 0;
    if (!(isalpha((unsigned char)*p) || *p == '_')) return NULL;
    while (isalnum((unsigned char)p[n]) || p[n] == '_') {
        if (n + 1 >= LPX_MAX_NAME) return NULL;
        dst[n] = p[n];
        n++;
    }
    dst[n] = 0;
    return p + n;
}

#define FAIL(msg) return lpx_error(LPX_EINVAL, "%s: bad schema \"%s\" at offset %d: %s", what, text, (int)(p - text), msg)

lpx_status lpx_schema_parse(const char *text, bool with_name, const char *what, lpx_schema *out)
{
    if (!text) return lpx_error(LPX_EINVAL, "%s: schema is NULL", what);
    memset(out, 0, sizeof *out);
    const char *p = skip_ws(text);
    if (with_name) {
        const char *q = parse_ident(p, out->name);
        if (!q) FAIL("expected an op name (letters, digits, _; at most 47 chars)");
        p = skip_ws(q);
        if (*p != '(') FAIL("expected '('");
        p = skip_ws(p + 1);
    }
    char end_args = with_name ? ')' : '-';
    if (*p != end_args) {
        for (;;) {
            if (out->nargs == LPX_MAX_ARGS) FAIL("more than 16 arguments");
            lpx_arg_spec *a = &out->args[out->nargs];
            const char *q = parse_type(p, &a->tag, &a->optional, &a->host);
            if (!q) FAIL("unknown argument type");
            p = skip_ws(q);
            if (isalpha((unsigned char)*p) || *p == '_') {
                q = parse_ident(p, a->name);
                if (!q) FAIL("bad argument name");
                p = skip_ws(q);
            } else if (with_name) {
                FAIL("argument needs a name");
            }
            out->nargs++;
            if (*p == ',') { p = skip_ws(p + 1); continue; }
            break;
        }
    }
    if (with_name) {
        if (*p != ')') FAIL("expected ',' or ')'");
        p = skip_ws(p + 1);
    }
    if (p[0] != '-' || p[1] != '>') FAIL("expected '->'");
    p = skip_ws(p + 2);
    bool paren = *p == '(';
    if (paren) p = skip_ws(p + 1);
    while (*p && *p != ')') {
        if (out->nrets == LPX_MAX_RETS) FAIL("more than 4 results");
        if (strncmp(p, "Tensor", 6) != 0 || isalnum((unsigned char)p[6]) || p[6] == '?' || p[6] == '[')
            FAIL("results must be Tensor");
        out->rets[out->nrets++] = LPX_TAG_TENSOR;
        p = skip_ws(p + 6);
        if (*p == ',' && paren) { p = skip_ws(p + 1); continue; }
        break;
    }
    if (paren) {
        if (*p != ')') FAIL("expected ')' after results");
        p = skip_ws(p + 1);
    }
    if (*p) FAIL("trailing characters");
    if (!paren && out->nrets == 0) FAIL("missing result type (use () for none)");
    return LPX_OK;
}
