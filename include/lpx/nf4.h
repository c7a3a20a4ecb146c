/* lpx — the nf4 kind (being written). */
#ifndef LPX_NF4_H
#define LPX_NF4_H
#include "export.h"
#endif
