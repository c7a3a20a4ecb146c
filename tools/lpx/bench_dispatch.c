/* lpx bench dispatch (being written). */
#include "commands.h"
int lpx_bench_dispatch(int argc, char **argv) { (void)argc; (void)argv; return 0; }
