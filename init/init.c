/* The composition root: library initialisation wires every layer (the
 * built-in dtypes, ops, the CPU backend and its kernels, the "local" comm
 * backend, the built-in kinds, plugins from LPX_PLUGIN_PATH, tracing from
 * the environment). It is the only file that names them all, and the top
 * of the layer graph (docs/ARCHITECTURE.md); lower layers reach it only
 * through lpx_ensure_init() (core/lpx_internal.h), the lazy entry point
 * every public function calls. Runs once. */
#include <pthread.h>
#include <stdio.h>
#include "../core/lpx_internal.h"

atomic_bool lpx__inited;
static pthread_mutex_t init_mutex = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool in_init;     /* registration calls made by init itself */
static lpx_status init_status = LPX_OK;
static char init_message[512];

lpx_status lpx_init(void)
{
    if (atomic_load_explicit(&lpx__inited, memory_order_acquire) || in_init) return LPX_OK;
    pthread_mutex_lock(&init_mutex);
    if (!atomic_load(&lpx__inited)) {
        if (init_status != LPX_OK) {
            /* a failed init is not retried: the registry may be half built */
            pthread_mutex_unlock(&init_mutex);
            return lpx_error(init_status, "lpx_init failed earlier: %s", init_message);
        }
        in_init = true;
        lpx_status st = lpx_dtype_init_builtins();
        if (!st) st = lpx_ops_init_builtins();
        if (!st) st = lpx_cpu_backend_init();
        if (!st) st = lpx_local_backend_init();
        if (!st) st = lpx_builtin_kinds_init();
        /* plugins from LPX_PLUGIN_PATH: a plugin that fails is recorded in
         * the skipped list (lpx info), never an init failure */
        if (!st) lpx_plugins_init_from_env();
        in_init = false;
        if (st) {
            init_status = st;
            snprintf(init_message, sizeof init_message, "%s", lpx_last_error());
            pthread_mutex_unlock(&init_mutex);
            return st;
        }
        atomic_store_explicit(&lpx__inited, true, memory_order_release);
        lpx_trace_init_from_env();
    }
    pthread_mutex_unlock(&init_mutex);
    return LPX_OK;
}
