/* Fuzz target: op schema strings. The input (as a C string) is parsed as
 * an op schema and as a bare kernel signature (lpx_schema_parse), then
 * registered with lpx_op_register. Successful registrations persist (ops
 * cannot be unregistered outside a plugin rollback), so a name the fuzzer
 * repeats gives LPX_EEXIST and, once the table is full, LPX_EFULL: both
 * after the parse, which is what is under test. */
#include "fuzz_util.h"
#include "dispatch/dispatch_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096) return -1;
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = 0;

    lpx_schema s;
    lpx_status named = lpx_schema_parse(text, true, "fuzz", &s);
    if (!named) {
        FZ_ASSERT(s.nargs >= 0 && s.nargs <= LPX_MAX_ARGS && s.nrets >= 0 && s.nrets <= LPX_MAX_RETS);
        FZ_ASSERT(strlen(s.name) > 0 && strlen(s.name) < LPX_MAX_NAME);
    } else {
        FZ_ASSERT(named == LPX_EINVAL && lpx_last_error()[0]);
    }
    lpx_status sig = lpx_schema_parse(text, false, "fuzz", &s);
    FZ_ASSERT(sig == LPX_OK || sig == LPX_EINVAL);

    int before = lpx_op_count();
    lpx_op op = -1;
    lpx_status st = lpx_op_register(text, &op);
    if (st == LPX_OK) {
        /* the registered op reads back as parsed */
        FZ_ASSERT(named == LPX_OK && lpx_op_count() == before + 1);
        lpx_op found = -1;
        FZ_ASSERT(lpx_op_name(op) && lpx_op_find(lpx_op_name(op), &found) == LPX_OK && found == op);
        FZ_ASSERT(lpx_op_schema(op) && !strcmp(lpx_op_schema(op), text));
        lpx_schema again;
        FZ_ASSERT(lpx_schema_parse(text, true, "fuzz", &again) == LPX_OK);
        FZ_ASSERT(lpx_op_nargs(op) == again.nargs && lpx_op_nrets(op) == again.nrets);
    } else {
        /* a failed registration leaves the registry as it was */
        FZ_ASSERT(st == LPX_EINVAL || st == LPX_EEXIST || st == LPX_EFULL);
        FZ_ASSERT(lpx_op_count() == before);
        FZ_ASSERT((st == LPX_EINVAL) == (named != LPX_OK));
    }
    free(text);
    return 0;
}
