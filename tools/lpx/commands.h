/* Subcommands of the `lpx` tool. Each returns the process exit code:
 * 0 success, 1 runtime failure, 2 usage error. */
#ifndef LPX_TOOLS_COMMANDS_H
#define LPX_TOOLS_COMMANDS_H

int lpx_cmd_info(int argc, char **argv);
int lpx_cmd_bench(int argc, char **argv);
/* `lpx conformance [--kind NAME] [--plugin PATH] [--junit FILE]` */
int lpx_cmd_conformance(int argc, char **argv);
/* `lpx bench dispatch [--json] [--iters N]` */
int lpx_bench_dispatch(int argc, char **argv);
/* `lpx bench float8`, `lpx bench nf4` */
int lpx_bench_float8(int argc, char **argv);
int lpx_bench_nf4(int argc, char **argv);

#endif
