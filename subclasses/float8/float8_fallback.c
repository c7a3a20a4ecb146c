/* The opt-in "dequantize and redispatch" fallback of the float8 kind.
 *
 * Registered at the float8 key by lpx_float8_set_fallback(true), it runs
 * for every op without a float8 handler: each float8 argument (also inside
 * Tensor[] lists) is dequantized to its logical dtype, the op is dispatched
 * again on the dense arguments, and its dense results are returned. The
 * dispatcher counts each such call in the trace's "fallbacks" column, so
 * LPX_TRACE shows which ops ran dequantized.
 *
 * Ops that write into an argument (name ending in '_', or an argument
 * named "out") get the result written back into the float8 argument,
 * requantized with that tensor's own scales (the copy_ handler), and that
 * float8 tensor is returned in place of the temporary. */
#include <stdio.h>
#include <string.h>
#include "float8_internal.h"

/* Index of the argument called `name` in op's schema, or -1. */
static int arg_index(lpx_op op, const char *name)
{
    const char *s = lpx_op_schema(op);
    if (!s) return -1;
    const char *p = strchr(s, '(');
    if (!p) return -1;
    size_t n = strlen(name);
    int idx = 0;
    for (p++; *p && *p != ')'; p++) {
        if (*p == ',') {
            idx++;
            continue;
        }
        /* an argument's name is the word right before ',' or ')' */
        if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == ')') && p[-1] == ' ') return idx;
    }
    return -1;
}

static bool is_inplace_op(lpx_op op)
{
    const char *name = lpx_op_name(op);
    size_t n = name ? strlen(name) : 0;
    return n > 1 && name[n - 1] == '_';
}

lpx_status f8_fallback(lpx_call *c)
{
    const char *opname = lpx_op_name(c->op);
    int nargs = c->nargs;
    lpx_value args[LPX_MAX_ARGS];
    lpx_tensor *owned[LPX_MAX_ARGS * 2];   /* dequantized temporaries */
    lpx_tensor **lists[LPX_MAX_ARGS];      /* rebuilt Tensor[] arrays */
    int nowned = 0, nlists = 0;
    lpx_status st = LPX_OK;
    if (nargs > LPX_MAX_ARGS) return lpx_error(LPX_EINVAL, "%s (float8 fallback): %d arguments", opname, nargs);
    memcpy(args, c->args, (size_t)nargs * sizeof *args);
    int out_idx = arg_index(c->op, "out");
    int write_back = -1;   /* argument whose float8 tensor receives the result */
    for (int i = 0; i < nargs && !st; i++) {
        lpx_value *v = &args[i];
        if (v->tag == LPX_TAG_TENSOR && f8_is(v->u.t)) {
            if ((i == out_idx || (i == 0 && is_inplace_op(c->op))) && write_back < 0) write_back = i;
            lpx_tensor *d = NULL;
            if (nowned >= (int)(sizeof owned / sizeof *owned)) {
                st = lpx_error(LPX_EINVAL, "%s (float8 fallback): too many float8 arguments", opname);
                break;
            }
            if ((st = f8_dequantize(v->u.t, LPX_FLOAT8_LOGICAL, &d))) break;
            owned[nowned++] = d;
            v->u.t = d;
        } else if (v->tag == LPX_TAG_TENSORS && v->len) {
            bool any = false;
            for (uint32_t j = 0; j < v->len; j++) any = any || f8_is(v->u.ts[j]);
            if (!any) continue;
            lpx_tensor **arr = lpx_calloc(v->len, sizeof *arr);
            if (!arr) {
                st = lpx_error(LPX_ENOMEM, "%s (float8 fallback): cannot allocate a tensor list", opname);
                break;
            }
            lists[nlists++] = arr;
            for (uint32_t j = 0; j < v->len && !st; j++) {
                if (f8_is(v->u.ts[j])) st = f8_dequantize(v->u.ts[j], LPX_FLOAT8_LOGICAL, &arr[j]);
                else {
                    arr[j] = v->u.ts[j];
                    lpx_tensor_retain(arr[j]);
                }
            }
            v->u.ts = arr;
        }
    }
    lpx_call inner;
    lpx_call_init(&inner, c->op, args, nargs);
    if (!st) {
        st = lpx_dispatch(&inner);
    }
    if (!st) {
        lpx_tensor *tmp = write_back >= 0 ? args[write_back].u.t : NULL;
        lpx_tensor *orig = write_back >= 0 ? c->args[write_back].u.t : NULL;
        if (orig) st = lpx_copy_(orig, tmp);
        for (int r = 0; r < inner.nrets; r++) {
            lpx_value rv = inner.rets[r];
            if (!st && orig && rv.tag == LPX_TAG_TENSOR && rv.u.t == tmp) {
                /* the op returned its in-place argument: return the float8 one */
                lpx_tensor_release(rv.u.t);
                lpx_tensor_retain(orig);
                rv.u.t = orig;
            }
            c->rets[c->nrets++] = rv;
        }
        if (st) lpx_call_release_rets(c);
    }
    for (int i = 0; i < nowned; i++) lpx_tensor_release(owned[i]);
    for (int l = 0; l < nlists; l++) {
        /* find the list's length again from the argument that holds it */
        for (int i = 0; i < nargs; i++)
            if (args[i].tag == LPX_TAG_TENSORS && args[i].u.ts == lists[l])
                for (uint32_t j = 0; j < args[i].len; j++) lpx_tensor_release(lists[l][j]);
        lpx_free(lists[l]);
    }
    if (st) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        if (strstr(msg, "float8 fallback") == NULL) return lpx_error(st, "%s (float8 fallback): %s", opname, msg);
    }
    return st;
}
