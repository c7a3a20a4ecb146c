/* lpx conformance (being written). */
#include <stdio.h>
#include "commands.h"
int lpx_cmd_conformance(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "lpx conformance: not built yet\n"); return 1; }
