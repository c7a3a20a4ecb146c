/* `lpx bench <name>`: routes to the benchmarks. */
#include <stdio.h>
#include <string.h>
#include "commands.h"

static const struct { const char *name; int (*run)(int, char **); const char *what; } benches[] = {
    {"dispatch", lpx_bench_dispatch, "ns per call of a 16-element f32 add: direct, dispatched, 1 and 2 kind layers, vs PyTorch"},
    {"float8", lpx_bench_float8, "fused quantize vs memcpy, scaled_mm vs sgemm, Float8Linear fwd+bwd vs f32"},
    {"nf4", lpx_bench_nf4, "dequantize vs memcpy, NF4 linear vs sgemm, QLoRA linear fwd+bwd"},
    {"fsdp", lpx_bench_fsdp, "unshard+reshard of a group over 4 local ranks: bf16 vs float8 vs nf4, time and bytes"},
    {"ckpt", lpx_bench_ckpt, "sharded checkpoint save / load / resharded load vs the disk's write+fsync and read"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx bench <name> [--json] [options]\n\nbenchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
        fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].what);
    fprintf(f, "\n--json prints one JSON object per result line.\n");
}

int lpx_cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "lpx bench: unknown benchmark '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
