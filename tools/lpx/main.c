/* `lpx`: the command-line tool. Routes to subcommands. */
#include <stdio.h>
#include <string.h>
#include "lpx/lpx.h"
#include "commands.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lpx <command> [options]\n"
            "\n"
            "commands:\n"
            "  info              version, dtypes, kinds, backends, ops, plugins\n"
            "  bench <name>      benchmarks (lpx bench --help lists them)\n"
            "  conformance       contract suite for kinds and plugins (--help)\n"
            "  train             train a small LM: sharded fp8 / NF4-QLoRA / MX recipes (--help)\n"
            "  mem               memory per rank of a model before running it (--help)\n"
            "  eval              a Hugging Face Llama's loss and logits on given token ids (--help)\n"
            "  plan              a training step predicted at cluster scale from rates (--help)\n"
            "  help              this text\n"
            "  --version         print the version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("lpx %s\n", lpx_version());
        return 0;
    }
    if (lpx_init() != LPX_OK) {
        fprintf(stderr, "lpx: initialisation failed: %s\n", lpx_last_error());
        return 1;
    }
    lpx_tool_load_shipped_plugins();
    if (!strcmp(cmd, "info")) return lpx_cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return lpx_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "conformance")) return lpx_cmd_conformance(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return lpx_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "mem")) return lpx_cmd_mem_optim(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return lpx_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return lpx_cmd_plan(argc - 1, argv + 1);
    fprintf(stderr, "lpx: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
