/* lpx bench float8 (being written). */
#include <stdio.h>
#include "commands.h"
int lpx_bench_float8(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "lpx bench float8: not built yet\n"); return 1; }
