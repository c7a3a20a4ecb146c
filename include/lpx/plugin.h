/* lpx — the plugin ABI and the loader.
 *
 * A plugin is a shared object that exports one function,
 *
 *     lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info);
 *
 * and optionally
 *
 *     int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len);
 *
 * The loader dlopens the file, calls the probe (non-zero = "decline": no
 * GPU, no driver; the reason is recorded), then calls init. Init fills the
 * header of `info` first and then registers what the plugin brings (dtypes,
 * ops, kinds, kernels, fallbacks, backends) through the `host` table. The
 * loader journals every registration; if init fails, or `info` names a
 * different ABI major, a bad or duplicate name, everything is rolled back
 * and the registry is as it was before the call.
 *
 * ABI versioning. LPX_PLUGIN_ABI_MAJOR changes when an existing field or
 * function of lpx_host/lpx_plugin_info/lpx_kind_i changes meaning or
 * position: the loader refuses plugins built for another major.
 * LPX_PLUGIN_ABI_MINOR grows when fields are appended; both sides then read
 * only what `struct_size` covers, so a plugin built against 1.N loads in a
 * host speaking 1.M for any N, M (check LPX_HOST_HAS before using a slot
 * appended after 1.0).
 *
 * Unloading is not supported: lpx_plugin_unload refuses with LPX_ENOTIMPL.
 * Lock-free readers (dispatch tables, dtype traits of live tensors, kernels
 * in flight on other threads) may hold pointers into a plugin's code and
 * tables for the life of the process, so a loaded plugin stays mapped and
 * registered until exit. (A failed load is rolled back; see above.) */
#ifndef LPX_PLUGIN_H
#define LPX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"
#include "dtype.h"
#include "dispatch.h"
#include "kind.h"

LPX_BEGIN_DECLS

#define LPX_PLUGIN_ABI_MAJOR 1u
#define LPX_PLUGIN_ABI_MINOR 0u

/** Bytes of zeroed memory the loader provides behind `info` (a newer
 *  plugin's larger struct still fits; the loader reads only what it knows). */
#define LPX_PLUGIN_INFO_CAPACITY 1024

/** Marks the plugin's entry points for export (plugins are usually built
 *  with -fvisibility=hidden). */
#if defined(_WIN32)
#  define LPX_PLUGIN_EXPORT __declspec(dllexport)
#else
#  define LPX_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/** What a plugin says about itself. Init sets struct_size to
 *  sizeof(lpx_plugin_info) as it was compiled, abi_major/abi_minor to
 *  LPX_PLUGIN_ABI_MAJOR/MINOR, and name/version, before registering
 *  anything: the host refuses registrations until the header names this
 *  ABI major. Strings must stay valid while init runs (the loader copies
 *  them). */
typedef struct lpx_plugin_info {
    size_t struct_size;
    uint32_t abi_major;
    uint32_t abi_minor;
    const char *name;        /* unique, 1..63 chars of [A-Za-z0-9_.-] */
    const char *version;     /* free form, e.g. "0.1.0" */
    /* ---- ABI 1.0 header ends here; fields below are optional */
    const char *description; /* one line for `lpx info`, may be NULL */
} lpx_plugin_info;

/** Size of the info header the loader requires (up to `version`). */
#define LPX_PLUGIN_INFO_HEADER_SIZE (offsetof(lpx_plugin_info, version) + sizeof(const char *))

typedef struct lpx_host lpx_host;

/** The host table: the registration functions a plugin must use (they are
 *  the public lpx_*_register functions, journaled for rollback and checked
 *  against the plugin's declared ABI). They work only while the plugin's
 *  init runs, on the thread that runs it; after that they fail with
 *  LPX_EPLUGIN. Each takes the host pointer it was given as first argument. */
struct lpx_host {
    size_t struct_size;      /* sizeof(lpx_host) of the loader */
    uint32_t abi_major;      /* LPX_PLUGIN_ABI_MAJOR of the loader */
    uint32_t abi_minor;
    const char *lpx_version; /* "0.1.0" */
    const char *plugin_path; /* the file being loaded */
    void *loader;            /* opaque: the load in progress */

    lpx_status (*dtype_register)(const lpx_host *h, const lpx_dtype_traits *traits, lpx_dtype *out);
    lpx_status (*op_register)(const lpx_host *h, const char *schema, lpx_op *out);
    lpx_status (*kind_register)(const lpx_host *h, const lpx_kind_i *vtable, const lpx_kind **out);
    lpx_status (*kernel_register)(const lpx_host *h, lpx_op op, int key, lpx_kernel_fn fn, void *data);
    lpx_status (*kernel_register_typed)(const lpx_host *h, lpx_op op, int key, const char *signature,
                                        void (*fn)(void));
    lpx_status (*fallback_register)(const lpx_host *h, int key, lpx_kernel_fn fn, void *data);
    lpx_status (*backend_register)(const lpx_host *h, const lpx_backend_i *backend, int *key);
    /* ---- ABI 1.0 ends here; later minors append (comm backends: 1.1) */
};

/** True if the host table `h` has the slot `field` (it may be older than
 *  the plugin's headers). */
#define LPX_HOST_HAS(h, field) \
    ((h)->struct_size >= offsetof(lpx_host, field) + sizeof((h)->field) && (h)->field != NULL)

typedef lpx_status (*lpx_plugin_init_fn)(const lpx_host *host, lpx_plugin_info *info);
typedef int (*lpx_plugin_probe_fn)(const lpx_host *host, char *reason, size_t len);

/* ---- loader ------------------------------------------------------- */

typedef struct lpx_plugin lpx_plugin;

/** Loads the plugin at `path` (a file name without '/' is searched like
 *  dlopen does). On success *out (may be NULL) is the loaded plugin, valid
 *  for the process. On failure nothing the plugin registered remains, the
 *  path and reason are added to the skipped list, and lpx_last_error()
 *  names the plugin (when known), the path and the reason. Errors:
 *  LPX_EINVAL (NULL path), LPX_EPLUGIN (cannot open, no entry point,
 *  declined by its probe, init failed, bad info, duplicate name, already
 *  loaded), LPX_EABI (different ABI major). Thread-safe; loads serialize. */
LPX_API lpx_status lpx_plugin_load(const char *path, const lpx_plugin **out);

/** Always refused (LPX_ENOTIMPL, with the reason): see the file comment. */
LPX_API lpx_status lpx_plugin_unload(const lpx_plugin *plugin);

/** Loaded plugins, in load order. */
LPX_API int lpx_plugin_count(void);
/** Plugin i, or NULL. */
LPX_API const lpx_plugin *lpx_plugin_at(int i);
/** Finds a loaded plugin by name. Errors: LPX_EINVAL, LPX_ENOTFOUND. */
LPX_API lpx_status lpx_plugin_find(const char *name, const lpx_plugin **out);
LPX_API const char *lpx_plugin_name(const lpx_plugin *p);
LPX_API const char *lpx_plugin_version(const lpx_plugin *p);
/** Description given by the plugin, or "". */
LPX_API const char *lpx_plugin_description(const lpx_plugin *p);
/** Path the plugin was loaded from. */
LPX_API const char *lpx_plugin_path(const lpx_plugin *p);
/** Address of the exported symbol `name` of a loaded plugin (dlsym on its
 *  handle), or NULL (NULL arguments, no such symbol, a plugin linked into
 *  the host). How a plugin offers extras beyond the registry, e.g.
 *  lpx-cuda.so's memory statistics (include/lpx/cuda.h). */
LPX_API void *lpx_plugin_symbol(const lpx_plugin *p, const char *name);
/** ABI the plugin was built for. */
LPX_API void lpx_plugin_abi(const lpx_plugin *p, uint32_t *major, uint32_t *minor);
/** What the plugin registered: counts of dtypes, ops, kinds, kernels
 *  (typed ones included), fallbacks and backends; any pointer may be NULL. */
LPX_API void lpx_plugin_registered(const lpx_plugin *p, int *dtypes, int *ops, int *kinds,
                                   int *kernels, int *fallbacks, int *backends);

/** Plugins that failed to load or declined (by lpx_plugin_load or the
 *  LPX_PLUGIN_PATH scan), oldest failure first, one entry per path: a
 *  path that fails again moves to the end with its newest reason (retries
 *  do not grow the list). Strings are valid for the process. */
LPX_API int lpx_plugin_skipped_count(void);
/** Path of skipped entry i, or NULL. */
LPX_API const char *lpx_plugin_skipped_path(int i);
/** Reason entry i was skipped ("declined: no CUDA device", "ABI major 2,
 *  this lpx speaks 1", ...), or NULL. */
LPX_API const char *lpx_plugin_skipped_reason(int i);

/** Loads every lpx-*.so in the colon-separated directories of `dirs` (in
 *  name order per directory). Failures are recorded in the skipped list,
 *  not returned. lpx_init does this once with $LPX_PLUGIN_PATH. Returns
 *  the number of plugins loaded. */
LPX_API int lpx_plugin_scan(const char *dirs);

/* ---- what the plugin itself defines ------------------------------- */

/** The plugin's entry point (defined by the plugin, LPX_PLUGIN_EXPORT). */
LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info);
/** Optional: return 0 to proceed, non-zero to decline with a reason
 *  written into reason[0..len). Must not register anything. */
LPX_PLUGIN_EXPORT int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len);

LPX_END_DECLS

#endif
