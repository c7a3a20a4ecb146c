/* Loader internals: the registration journal that makes a plugin load
 * transactional. Not installed. */
#ifndef LPX_PLUGIN_INTERNAL_H
#define LPX_PLUGIN_INTERNAL_H

#include "../core/journal.h"

/* Undoes every recorded registration, newest first (plugins/rollback.c).
 * Never fails: entries already gone are skipped. Clobbers lpx_last_error(). */
void lpx_journal_rollback(lpx_journal *j);

/* ---- plugin records (plugins/loader.c) */

#define LPX_PLUGIN_NAME_MAX 64

typedef enum plugin_state { PLUGIN_LOADING, PLUGIN_LOADED, PLUGIN_FAILED } plugin_state;

/* One load attempt. Records of loaded plugins, and of failed loads whose
 * code ran (the library stays mapped, and the plugin may have kept its
 * host pointer), are never freed. */
struct lpx_plugin {
    _Atomic int state;             /* plugin_state */
    char name[LPX_PLUGIN_NAME_MAX];
    char version[LPX_PLUGIN_NAME_MAX];
    char description[256];
    const char *path;              /* as given (in strs) */
    const char *real;              /* realpath, or the path as given (in strs) */
    uint32_t abi_major, abi_minor;
    void *handle;                  /* dlopen handle */
    lpx_host host;                 /* the table handed to this plugin */
    lpx_plugin_info *info;         /* LPX_PLUGIN_INFO_CAPACITY bytes, during init */
    lpx_journal journal;           /* open while init runs */
    int counts[LPX_REG_COMM_BACKEND + 1];
    struct lpx_plugin *failed_next;  /* failed loads stay reachable */
    char strs[];                   /* path and real, sized to fit: failed loads whose
                                      code ran are kept, so a record stays small */
};

/* Longest plugin path lpx_plugin_load accepts (bytes, without the NUL). */
#define LPX_PLUGIN_PATH_MAX 4095

/* Adds (path, reason) to the skipped list (plugins/loader.c). */
void lpx_plugin_add_skipped(const char *path, const char *reason);

/* Fills p->host with the registration functions (plugins/host.c). */
void lpx_host_init(lpx_plugin *p);

/* The gate of a loading plugin's journal: registrations are allowed once
 * the info header declares this ABI major and a valid, free name. */
lpx_status lpx_plugin_gate(void *ctx, const char *what);

/* Test hook for the fuzzer: the checks lpx_plugin_load applies to the info
 * a successful init filled (`info`: LPX_PLUGIN_INFO_CAPACITY bytes). */
lpx_status lpx__plugin_accept_info(lpx_plugin_info *info, char *reason, size_t len);

/* True when `path` can be handed to dlopen: a regular file holding a
 * shared object for this machine whose headers and segments lie inside it
 * (plugins/elf_check.c); else false with the reason. Never blocks. */
bool lpx_plugin_file_ok(const char *path, char *reason, size_t len);

#endif
