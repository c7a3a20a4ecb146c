/* The contract between the plugin_load fuzz target (fuzz_plugin_load.c)
 * and the plugin it loads (fuzz_plugin_so.c, built as lpx-fuzz-plugin.so).
 *
 * The target exports one object, `lpx_fuzz_plugin_script` (the executable
 * is linked with -rdynamic); the plugin finds it with
 * dlsym(RTLD_DEFAULT, ...) in its probe and init, reads the fuzz input from
 * it (what to declare in lpx_plugin_info, what to register, in which
 * order, where to fail) and records what it did, so the target can check
 * the loader's verdict and its rollback against it. The plugin does not
 * link liblpx: everything it calls comes through the host table or the
 * entry points below. */
#ifndef LPX_FUZZ_PLUGIN_SCRIPT_H
#define LPX_FUZZ_PLUGIN_SCRIPT_H

#include <stddef.h>
#include <stdint.h>
#include "lpx/lpx.h"

#define FZP_SYMBOL "lpx_fuzz_plugin_script"
#define FZP_MAX_REC 32

typedef struct fzp_kernel_rec {
    lpx_op op;
    int key;
} fzp_kernel_rec;

typedef struct fzp_script {
    /* set by the target before each load */
    const uint8_t *data;
    size_t size;
    int force_fail;          /* init must fail in the end (no fresh path left to succeed on) */
    lpx_status (*plugin_load)(const char *path, const lpx_plugin **out);
    lpx_status (*kind_register)(const lpx_kind_i *vt, const lpx_kind **out);
    lpx_status (*op_register)(const char *schema, lpx_op *out);
    lpx_status (*tensor_new)(lpx_dtype dtype, int ndim, const int64_t *shape, lpx_device device, lpx_tensor **out);
    lpx_status (*tensor_new_kind)(const lpx_kind *kind, lpx_dtype logical_dtype, int ndim, const int64_t *shape,
                                  lpx_device device, lpx_tensor *const *inner, int ninner, const void *meta,
                                  size_t meta_size, lpx_tensor **out);
    void (*tensor_release)(lpx_tensor *t);
    int (*kind_key)(const lpx_kind *k);
    lpx_status (*error)(lpx_status s, const char *fmt, ...);

    /* set by the plugin */
    int probe_ran, init_ran, info_filled;
    /* successful registrations, by lpx_reg_what order: dtypes, ops, kinds,
     * kernels (typed included), fallbacks, backends */
    int registered[6];
    lpx_op ops[FZP_MAX_REC];
    int nops;
    fzp_kernel_rec kernels[FZP_MAX_REC];
    int nkernels;
    int fallback_keys[FZP_MAX_REC];
    int nfallbacks;
    const lpx_kind *kinds[FZP_MAX_REC];
    int nkinds;
    int32_t device_types[FZP_MAX_REC];
    int nbackends;
    lpx_tensor *kept;        /* a tensor of a kind it registered, left alive for the target to release */
} fzp_script;

#endif
