/* The library's version, as a string and as the number plugins compare
 * (LPX_VERSION_NUMBER, include/lpx/lpx.h). */
#include "lpx_internal.h"

const char *lpx_version(void) { return LPX_VERSION_STRING; }
int lpx_version_number(void) { return LPX_VERSION_NUMBER; }
