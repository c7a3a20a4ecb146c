/* lpx — low-precision tensor kinds and sharding. The umbrella header. */
#ifndef LPX_LPX_H
#define LPX_LPX_H

#include "export.h"
#include "status.h"
#include "dtype.h"
#include "tensor.h"
#include "dispatch.h"
#include "kind.h"
#include "ops.h"
#include "trace.h"
#include "comm.h"
#include "float8.h"
#include "nf4.h"
#include "optim_state.h"
#include "dtensor.h"
#include "fsdp.h"
#include "plugin.h"
#include "dlpack.h"
#include "safetensors.h"
#include "checkpoint.h"
#include "meta.h"

LPX_BEGIN_DECLS

#define LPX_VERSION_MAJOR 0
#define LPX_VERSION_MINOR 1
#define LPX_VERSION_PATCH 0
/** The version as one comparable number: major * 10000 + minor * 100 +
 *  patch (0.1.0 -> 100), as SQLite's SQLITE_VERSION_NUMBER. */
#define LPX_VERSION_NUMBER (LPX_VERSION_MAJOR * 10000 + LPX_VERSION_MINOR * 100 + LPX_VERSION_PATCH)

/** Version string of the loaded library ("0.1.0"). */
LPX_API const char *lpx_version(void);
/** LPX_VERSION_NUMBER of the loaded library (which may be newer than the
 *  headers a program or plugin was compiled with). Never fails. */
LPX_API int lpx_version_number(void);

/** Registers the built-in dtypes, ops, backends and CPU kernels and reads
 *  LPX_TRACE. Idempotent and thread-safe; every entry point calls it, so
 *  calling it explicitly is only needed to catch an init failure early.
 *  Errors: LPX_ENOMEM, LPX_EINTERNAL. */
LPX_API lpx_status lpx_init(void);

LPX_END_DECLS

#endif
