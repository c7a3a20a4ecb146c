/* lpx — the float8 kind (being written). */
#ifndef LPX_FLOAT8_H
#define LPX_FLOAT8_H
#include "export.h"
#endif
