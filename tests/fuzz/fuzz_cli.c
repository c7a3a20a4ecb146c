/* Fuzz target: `lpx` command-line parsing. The input is split at NUL
 * bytes into arguments (at most 24; argv[0] is "lpx") and handed to:
 *  - tools/lpx/main.c's router (compiled in as lpx_tool_main), which
 *    reaches `lpx info`, `lpx bench` (the benchmark bodies are stubs here:
 *    only the routing and its errors are exercised), `lpx conformance`
 *    (always with --list inserted first, so no contract runs and nothing
 *    forks; --plugin values are replaced by "", which lpx_plugin_load
 *    refuses up front, so no library the fuzzer names is ever loaded) and `lpx mem`;
 *  - for `lpx train`, the option parser tr_parse_train (tools/train/
 *    options.c) instead of the router, which would start training.
 * stdout and stderr of the tool go to /dev/null (the sanitizers and
 * libFuzzer report on the original stderr). Exit codes must be 0, 1 or 2
 * (1 only from info and mem: runtime failure). */
#include <stdbool.h>
#include "fuzz_util.h"
#include "tools/train/train.h"
#include "tools/lpx/commands.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int lpx_tool_main(int argc, char **argv);

/* the benchmarks are not run by the fuzzer */
int lpx_bench_dispatch(int argc, char **argv) { (void)argc; (void)argv; return 0; }
int lpx_bench_float8(int argc, char **argv) { (void)argc; (void)argv; return 0; }
int lpx_bench_nf4(int argc, char **argv) { (void)argc; (void)argv; return 0; }
int lpx_bench_fsdp(int argc, char **argv) { (void)argc; (void)argv; return 0; }
int lpx_bench_ckpt(int argc, char **argv) { (void)argc; (void)argv; return 0; }

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    fz_init();
    devnull = fopen("/dev/null", "w");
    if (!devnull) abort();
    return 0;
}

#define MAXARG 24

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 2048) return -1;
    char *buf = malloc(size + 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    buf[size] = 0;
    char *args[MAXARG + 2];
    int argc = 0;
    args[argc++] = "lpx";
    for (size_t i = 0; i <= size && argc < MAXARG;) {
        args[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    char noplugin[] = "";
    char list[] = "--list";
    if (argc >= 2 && !strcmp(args[1], "conformance")) {
        /* --list first, where no option can take it as its value */
        memmove(args + 3, args + 2, (size_t)(argc - 2) * sizeof *args);
        args[2] = list;
        argc++;
        for (int i = 3; i + 1 < argc; i++)
            if (!strcmp(args[i], "--plugin")) args[++i] = noplugin;
    }
    args[argc] = NULL;

    FILE *out = stdout, *err = stderr;
    stdout = devnull;
    stderr = devnull;
    int rc;
    bool ok;
    if (argc >= 2 && !strcmp(args[1], "train")) {
        tr_opts o;
        bool help = false;
        rc = tr_parse_train(argc - 1, args + 1, &o, &help);
        ok = rc == 0 || rc == 2 || (rc == 1 && help);
        /* with --resume the parser defers these checks until the
         * checkpoint's manifest has filled in the options not given
         * (tr_ckpt_apply, then tr_check_opts): they hold then, not here */
        if (rc == 0 && !o.resume_dir)
            ok = o.ranks >= 1 && o.micro % o.ranks == 0 && o.batch % o.micro == 0 && o.m.dim >= 2 &&
                 o.m.heads >= 1 && o.m.dim % o.m.heads == 0 && o.m.heads % o.m.kv_heads == 0 &&
                 (o.m.dim / o.m.heads) % 2 == 0;   /* (any dim: the recipes pad their last block) */
    } else {
        rc = lpx_tool_main(argc, args);
        ok = rc >= 0 && rc <= 2;
    }
    stdout = out;
    stderr = err;
    if (!ok) fprintf(stderr, "fuzz: %s %s...: exit code %d\n", args[0], argc > 1 ? args[1] : "", rc);
    FZ_ASSERT(ok);
    free(buf);
    return 0;
}
