/* lpx bench nf4 (being written). */
#include <stdio.h>
#include "commands.h"
int lpx_bench_nf4(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "lpx bench nf4: not built yet\n"); return 1; }
