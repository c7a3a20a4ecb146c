/* The op-spec test harness (include/lpx/op_args.h): a backend registered
 * through the public API (lpx_backend_register, lpx_kernel_register: what
 * a plugin calls) whose kernels check nothing, one for every op with a
 * spec family, and tables of bad arguments fed to both it and the CPU:
 * each call must be refused by the dispatcher with the CPU's status and
 * message (and the message the CPU kernels wrote before the spec, pinned
 * in the table), the check-free kernel never running. Included by
 * tests/test_spec*.c, one table per group of ops. */
#ifndef LPX_TESTS_SPEC_HARNESS_H
#define LPX_TESTS_SPEC_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define NOCHK_DEVICE 40   /* a device type no built-in uses */
#define SPEC_MAX_ARGS 16   /* adamw_state_ has 16 */
#define SPEC_MAX_LIST 4

static int reached;           /* kernel calls of the check-free backend */
static const void *seen_args; /* the op_args its last call got */

static void *nc_alloc(void *self, lpx_device dev, size_t nbytes)
{
    (void)self; (void)dev;
    return calloc(1, nbytes ? nbytes : 1);
}
static void nc_free(void *self, lpx_device dev, void *p, size_t nbytes)
{
    (void)self; (void)dev; (void)nbytes;
    free(p);
}
static lpx_status nc_copy(void *self, void *dst, lpx_device dd, const void *src, lpx_device sd, size_t n)
{
    (void)self; (void)dd; (void)sd;
    memmove(dst, src, n);
    return LPX_OK;
}
static lpx_status nc_sync(void *self, lpx_device dev) { (void)self; (void)dev; return LPX_OK; }

/* arithmetic only, and here not even that: no argument is looked at */
static lpx_status k_nocheck(lpx_call *c)
{
    reached++;
    seen_args = lpx_op_args_of(c);
    return lpx_error(LPX_EINTERNAL, "%s: the check-free kernel ran", lpx_op_name(c->op));
}

static int nc_key;

/* Registers the check-free backend and its kernel for every op with a
 * spec family; returns how many ops have one. */
static int spec_setup(void)
{
    static const lpx_backend_i b = {
        .struct_size = sizeof(lpx_backend_i), .name = "nochk", .device_type = NOCHK_DEVICE,
        .alloc = nc_alloc, .free = nc_free, .copy = nc_copy, .sync = nc_sync, .self = NULL,
    };
    CHECK_OK(lpx_backend_register(&b, &nc_key));
    int with_spec = 0;
    for (lpx_op op = 0; op < lpx_op_count(); op++) {
        if (!lpx_op_spec_size(op)) continue;
        CHECK_OK(lpx_kernel_register(op, nc_key, k_nocheck, NULL));
        with_spec++;
    }
    return with_spec;
}

/* ---- argument sets, built on either device ------------------------- */

typedef struct targ {
    lpx_dtype dtype;
    int ndim;
    int64_t shape[4];
} targ;

/* T: a tensor (dtype, ndim, dims...), uninitialised (zeros on nochk);
 * N: absent; I: int; F: float; B: bool; D: dtype; V: the case's device;
 * L(n, ...): an int list; S(n, T...): a tensor list. */
#define T(dt, n, ...) {.kind = 'T', .t = {dt, n, {__VA_ARGS__}}}
#define TA(dt, n, ...) {dt, n, {__VA_ARGS__}}
#define NONE {.kind = 'N'}
#define I(v) {.kind = 'I', .i = v}
#define F(v) {.kind = 'F', .f = v}
#define B(v) {.kind = 'B', .i = v}
#define D(v) {.kind = 'D', .i = v}
#define V {.kind = 'V'}
#define L(n, ...) {.kind = 'L', .i = n, .list = {__VA_ARGS__}}
#define S(n, ...) {.kind = 'S', .i = n, .ts = {__VA_ARGS__}}

typedef struct arg {
    char kind;
    targ t;
    int64_t i;
    double f;
    int64_t list[SPEC_MAX_LIST];
    targ ts[SPEC_MAX_LIST];
} arg;

typedef struct bad_case {
    const char *op;
    int nargs;
    arg args[SPEC_MAX_ARGS];
    lpx_status want;
    const char *msg;   /* the CPU kernels' message before the spec (exact), or NULL */
} bad_case;

typedef struct built_args {
    lpx_value v[SPEC_MAX_ARGS];
    lpx_tensor *ts[SPEC_MAX_ARGS];
    lpx_tensor *lists[SPEC_MAX_ARGS][SPEC_MAX_LIST];
    int nargs;
} built_args;

/* Builds the args of case k on device dev. */
static void spec_build(const bad_case *k, lpx_device dev, built_args *b)
{
    memset(b, 0, sizeof *b);
    b->nargs = k->nargs;
    for (int i = 0; i < k->nargs; i++) {
        const arg *a = &k->args[i];
        switch (a->kind) {
        case 'T':
            CHECK_OK(lpx_tensor_new(a->t.dtype, a->t.ndim, a->t.shape, dev, &b->ts[i]));
            b->v[i] = lpx_v_tensor(b->ts[i]);
            break;
        case 'I': b->v[i] = lpx_v_i64(a->i); break;
        case 'F': b->v[i] = lpx_v_f64(a->f); break;
        case 'B': b->v[i] = lpx_v_bool(a->i != 0); break;
        case 'D': b->v[i] = lpx_v_dtype((lpx_dtype)a->i); break;
        case 'V': b->v[i] = lpx_v_device(dev); break;
        case 'L': b->v[i] = lpx_v_ints(a->list, (uint32_t)a->i); break;
        case 'S':
            for (int j = 0; j < a->i; j++)
                CHECK_OK(lpx_tensor_new(a->ts[j].dtype, a->ts[j].ndim, a->ts[j].shape, dev, &b->lists[i][j]));
            b->v[i] = lpx_v_tensors(b->lists[i], (uint32_t)a->i);
            break;
        default: b->v[i] = lpx_v_none(); break;
        }
    }
}

static void spec_built_free(built_args *b)
{
    for (int i = 0; i < b->nargs; i++) {
        lpx_tensor_release(b->ts[i]);
        for (int j = 0; j < SPEC_MAX_LIST; j++) lpx_tensor_release(b->lists[i][j]);
    }
}

static lpx_status spec_run_case(const bad_case *k, lpx_device dev, char *msg, size_t len)
{
    lpx_op op;
    CHECK_OK(lpx_op_find(k->op, &op));
    built_args b;
    spec_build(k, dev, &b);
    lpx_call c;
    lpx_call_init(&c, op, b.v, k->nargs);
    lpx_status st = lpx_dispatch(&c);
    snprintf(msg, len, "%s", st ? lpx_last_error() : "");
    if (!st) lpx_call_release_rets(&c);
    spec_built_free(&b);
    return st;
}

/* Every case of the table refused alike by the CPU and the check-free
 * backend, by the dispatcher (the check-free kernel never runs); each op
 * of the table has a spec family. */
__attribute__((unused)) static void spec_check_bad(const bad_case *bad, size_t n)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    for (size_t i = 0; i < n; i++) {
        const bad_case *k = &bad[i];
        lpx_op op;
        CHECK_OK(lpx_op_find(k->op, &op));
        CHECKF(lpx_op_spec_size(op) > 0, "case %zu (%s): the op has no spec family", i, k->op);
        char cpu_msg[1024], nc_msg[1024];
        lpx_status cpu_st = spec_run_case(k, lpx_cpu(), cpu_msg, sizeof cpu_msg);
        int before = reached;
        lpx_status nc_st = spec_run_case(k, nc, nc_msg, sizeof nc_msg);
        CHECKF(cpu_st == k->want, "case %zu (%s): cpu status %d, want %d (%s)", i, k->op, cpu_st, k->want, cpu_msg);
        CHECKF(nc_st == cpu_st, "case %zu (%s): check-free backend status %d, cpu %d (%s)", i, k->op, nc_st, cpu_st,
               nc_msg);
        CHECKF(reached == before, "case %zu (%s): the check-free kernel ran on bad arguments", i, k->op);
        CHECKF(!strcmp(cpu_msg, nc_msg), "case %zu (%s): messages differ:\n  cpu:    %s\n  nochk:  %s", i, k->op,
               cpu_msg, nc_msg);
        if (k->msg) CHECKF(!strcmp(cpu_msg, k->msg), "case %zu (%s): message '%s', want '%s'", i, k->op, cpu_msg, k->msg);
    }
}

/* Good arguments of case k reach the check-free kernel (status
 * LPX_EINTERNAL, its message): the dispatcher let them through. */
__attribute__((unused)) static void spec_check_good(const bad_case *good, size_t n)
{
    lpx_device nc = {NOCHK_DEVICE, 0};
    for (size_t i = 0; i < n; i++) {
        char msg[1024];
        int before = reached;
        lpx_status st = spec_run_case(&good[i], nc, msg, sizeof msg);
        CHECKF(st == LPX_EINTERNAL && reached == before + 1, "good case %zu (%s): status %d, kernel %s (%s)", i,
               good[i].op, st, reached == before + 1 ? "ran" : "did not run", msg);
    }
}

#endif
