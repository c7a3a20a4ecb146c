/* Subcommands of the `lpx` tool. Each returns the process exit code:
 * 0 success, 1 runtime failure, 2 usage error. */
#ifndef LPX_TOOLS_COMMANDS_H
#define LPX_TOOLS_COMMANDS_H

int lpx_cmd_info(int argc, char **argv);
int lpx_cmd_bench(int argc, char **argv);
/* `lpx conformance [--kind NAME] [--plugin PATH] [--junit FILE]` */
int lpx_cmd_conformance(int argc, char **argv);
/* `lpx bench dispatch [--json] [--reps N]` */
int lpx_bench_dispatch(int argc, char **argv);
/* `lpx bench float8`, `lpx bench nf4` */
int lpx_bench_float8(int argc, char **argv);
int lpx_bench_nf4(int argc, char **argv);
/* `lpx bench fsdp [--json] [--size N] [--iters K]` */
int lpx_bench_fsdp(int argc, char **argv);
int lpx_bench_ckpt(int argc, char **argv);
/* `lpx train [options]` (tools/train/): the reference training job */
int lpx_cmd_train(int argc, char **argv);
/* `lpx mem [options]` (tools/plan/cmd_mem.c): memory per rank of the lpx
 * train model, with lpx train's --optim / --master choices counted */
int lpx_cmd_mem_optim(int argc, char **argv);
/* `lpx plan [options]`: one training step predicted from rates (tools/plan/) */
int lpx_cmd_plan(int argc, char **argv);
/* `lpx eval --init DIR --tokens FILE`: a Hugging Face Llama's forward on given ids */
int lpx_cmd_eval(int argc, char **argv);

/* Loads plugin `file` shipped beside this executable (build tree:
 * <build>/<tree_dir>/<file>; install: <prefix>/lib{,64,/<triplet>}/lpx/<file>);
 * true once one loaded (tools/lpx/shipped_plugins.c). */
#include <stdbool.h>
bool lpx_tool_load_shipped(const char *tree_dir, const char *file);
/* The function `name` a loaded plugin exports (lpx_plugin_symbol), as a
 * data pointer to memcpy into its typed function pointer; NULL when the
 * plugin is not loaded or lacks it (no error is left behind). */
void *lpx_tool_plugin_fn(const char *plugin, const char *name);
/* What every lpx command does after lpx_init: unless LPX_PLUGIN_PATH is
 * set (to anything, even empty), load the shipped format plugin lpx-mx.so, so that `lpx info`,
 * `lpx conformance` and `lpx train` see the same kinds. Comm backends'
 * plugins (lpx-mpi.so) are loaded on demand by `--comm`. */
void lpx_tool_load_shipped_plugins(void);

#endif
