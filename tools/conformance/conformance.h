/* The conformance kit: contracts every kind must meet, checked through the
 * kind vtable and the dispatcher only (so they hold for built-in and
 * plugin kinds alike). `lpx conformance` enumerates the cases and runs
 * each one in a child process (tools/lpx/cmd_conformance.c); this code
 * runs inside that child and may crash or hang with a broken kind. */
#ifndef LPX_CONFORMANCE_H
#define LPX_CONFORMANCE_H

#include <stddef.h>
#include "lpx/lpx.h"

typedef enum cf_outcome { CF_PASS = 0, CF_FAIL = 1, CF_SKIP = 2 } cf_outcome;

typedef enum cf_contract {
    CF_DECLARES,        /* from_dense/to_dense and the declared shape are usable */
    CF_FLATTEN,         /* inner tensors + meta -> unflatten -> same values */
    CF_LOGICAL_DTYPE,   /* from_dense keeps the input's dtype as logical dtype */
    CF_QUANTIZE,        /* error within the declared bound, per distribution */
    CF_OP,              /* a declared op vs the dense op on dequantized inputs */
    CF_ALL_GATHER,      /* pre_all_gather / gather / post_all_gather, per world size */
    CF_SHARD_UNIT,      /* slicing at the shard unit; refusal inside one */
    CF_REFUSAL          /* bad input is refused with a message, not a crash */
} cf_contract;

typedef struct cf_case {
    char name[160];          /* "mxfp4/all_gather/world3", "float8[block]/quantize/normal" */
    const lpx_kind *kind;
    const lpx_conformance_variant *variant;   /* NULL: the kind's own from_dense */
    cf_contract contract;
    int arg;                 /* distribution, recipe index or world size */
    char skip[400];          /* non-empty: skipped without running, and why */
} cf_case;

/* Appends the cases of kind k to *v (grown with realloc). Reads only the
 * vtable and the registry: no kind code runs. Returns 0, or -1 on OOM. */
int cf_cases_for_kind(const lpx_kind *k, cf_case **v, int *n, int *cap);

/* Runs one case in this process; writes a one-line detail (why it failed,
 * or the measured numbers). */
cf_outcome cf_run(const cf_case *c, char *detail, size_t len);

#endif
