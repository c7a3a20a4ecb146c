/* The nf4 fallback: the opt-in "dequantize and redispatch" rule.
 *
 * It is registered once at the nf4 key and consults a process-wide switch
 * (off by default), so that an op without an nf4 handler fails with a
 * message that names the op, the kind and the way out instead of the
 * dispatcher's generic one. When the switch is on, every nf4 argument is
 * dequantized to its logical dtype and the call continues below the nf4 key
 * (lpx_redispatch over the substituted arguments). The dispatcher counts
 * these calls in the trace's "fallbacks" column of (op, nf4), so silent
 * dequantization shows up in LPX_TRACE. */
#include <ctype.h>
#include <stdatomic.h>
#include <string.h>
#include "nf4_internal.h"

static atomic_bool fallback_on;

void lpx_nf4_set_fallback(bool enabled) { atomic_store_explicit(&fallback_on, enabled, memory_order_release); }

bool lpx_nf4_fallback_enabled(void) { return atomic_load_explicit(&fallback_on, memory_order_acquire); }

/* Name of argument i in op's schema ("add(Tensor a, Tensor b, Tensor? out)"
 * -> "out" for i = 2), copied into buf; "" if it cannot be read. */
static const char *arg_name(lpx_op op, int i, char *buf, size_t len)
{
    buf[0] = 0;
    const char *s = lpx_op_schema(op);
    if (!s || !(s = strchr(s, '('))) return buf;
    s++;
    for (int k = 0; k < i; k++) {
        s = strchr(s, ',');
        if (!s) return buf;
        s++;
    }
    const char *end = s;
    while (*end && *end != ',' && *end != ')') end++;
    const char *b = end;
    while (b > s && isspace((unsigned char)b[-1])) b--;
    const char *a = b;
    while (a > s && (isalnum((unsigned char)a[-1]) || a[-1] == '_')) a--;
    size_t n = (size_t)(b - a) < len - 1 ? (size_t)(b - a) : len - 1;
    memcpy(buf, a, n);
    buf[n] = 0;
    return buf;
}

/* True if the op writes into argument i: in-place ops (name ending in '_')
 * write their first argument; "out" and "dst" arguments are written. */
static bool arg_is_written(lpx_op op, int i)
{
    const char *name = lpx_op_name(op);
    size_t n = name ? strlen(name) : 0;
    if (i == 0 && n && name[n - 1] == '_') return true;
    char a[64];
    arg_name(op, i, a, sizeof a);
    return !strcmp(a, "out") || !strcmp(a, "dst");
}

static lpx_status refuse(const lpx_call *c, const char *why)
{
    return lpx_error(LPX_ENOTIMPL,
                     "%s: not implemented for nf4 tensors%s%s (kind nf4); dequantize the nf4 argument first, or "
                     "enable the dequantize-and-redispatch fallback with lpx_nf4_set_fallback(true)",
                     lpx_op_name(c->op), why ? ": " : "", why ? why : "");
}

lpx_status nf4_fallback_run(lpx_call *c, const char *why)
{
    if (!lpx_nf4_fallback_enabled()) return refuse(c, why);
    const char *op = lpx_op_name(c->op);
    lpx_value args[LPX_MAX_ARGS];
    lpx_tensor *temps[LPX_MAX_ARGS];   /* dequantized single tensors */
    lpx_tensor **lists[LPX_MAX_ARGS];  /* substituted Tensor[] arrays */
    uint32_t list_len[LPX_MAX_ARGS];
    int ntemps = 0, nlists = 0;
    lpx_status st = LPX_OK;
    if (c->nargs > LPX_MAX_ARGS) return lpx_error(LPX_EINVAL, "%s: %d arguments", op, c->nargs);
    for (int i = 0; i < c->nargs && !st; i++) {
        args[i] = c->args[i];
        if (args[i].tag == LPX_TAG_TENSOR && lpx_nf4_is(args[i].u.t)) {
            if (arg_is_written(c->op, i)) {
                char a[64];
                st = lpx_error(LPX_ENOTIMPL, "%s: the fallback cannot write into nf4 argument '%s' (kind nf4); "
                               "compute into a dense tensor and lpx_nf4_quantize it", op,
                               arg_name(c->op, i, a, sizeof a));
                break;
            }
            lpx_tensor *d = NULL;
            st = nf4_to_dense(op, args[i].u.t, lpx_tensor_dtype(args[i].u.t), false, &d);
            if (!st) {
                temps[ntemps++] = d;
                args[i].u.t = d;
            }
        } else if (args[i].tag == LPX_TAG_TENSORS) {
            bool any = false;
            for (uint32_t j = 0; j < args[i].len; j++) any = any || lpx_nf4_is(args[i].u.ts[j]);
            if (!any) continue;
            lpx_tensor **ts = lpx_calloc(args[i].len, sizeof *ts);
            if (!ts) {
                st = lpx_error(LPX_ENOMEM, "%s: nf4 fallback cannot allocate a tensor list", op);
                break;
            }
            lists[nlists] = ts;
            list_len[nlists++] = args[i].len;
            for (uint32_t j = 0; j < args[i].len && !st; j++) {
                if (lpx_nf4_is(args[i].u.ts[j])) {
                    st = nf4_to_dense(op, args[i].u.ts[j], lpx_tensor_dtype(args[i].u.ts[j]), false, &ts[j]);
                } else {
                    ts[j] = args[i].u.ts[j];
                    lpx_tensor_retain(ts[j]);
                }
            }
            args[i].u.ts = ts;
        }
    }
    if (!st) {
        /* continue below the nf4 key over the dense arguments */
        const lpx_value *saved = c->args;
        c->args = args;
        st = lpx_redispatch(c);
        c->args = saved;
    }
    for (int i = 0; i < ntemps; i++) lpx_tensor_release(temps[i]);
    for (int k = 0; k < nlists; k++) {
        for (uint32_t j = 0; j < list_len[k]; j++) lpx_tensor_release(lists[k][j]);
        lpx_free(lists[k]);
    }
    return st;
}

static lpx_status nf4_fallback(lpx_call *c) { return nf4_fallback_run(c, NULL); }

lpx_status nf4_register_fallback(int key) { return lpx_fallback_register(key, nf4_fallback, NULL); }
