/* The host table handed to a plugin's init: the public registration
 * functions behind a check that the call comes from that init, on its
 * thread, while it runs. The registrations themselves are journaled by the
 * registry (lpx__journal_reserve/note), so a plugin that calls the public
 * lpx_*_register functions directly is rolled back just the same. */
#include "plugin_internal.h"

static lpx_status host_check(const lpx_host *h, const char *what)
{
    if (!h || !h->loader)
        return lpx_error(LPX_EINVAL, "lpx_host.%s: host is NULL or not the table the loader passed", what);
    lpx_plugin *p = h->loader;
    if (atomic_load(&p->state) != PLUGIN_LOADING || !lpx_journal_active())
        return lpx_error(LPX_EPLUGIN, "plugin %s%s%s(%s): lpx_host.%s called outside lpx_plugin_init "
                         "(registrations happen only while init runs, on its thread)",
                         p->name[0] ? "'" : "", p->name, p->name[0] ? "' " : "", p->path, what);
    return LPX_OK;
}

static lpx_status h_dtype(const lpx_host *h, const lpx_dtype_traits *t, lpx_dtype *out)
{
    lpx_status st = host_check(h, "dtype_register");
    return st ? st : lpx_dtype_register(t, out);
}

static lpx_status h_op(const lpx_host *h, const char *schema, lpx_op *out)
{
    lpx_status st = host_check(h, "op_register");
    return st ? st : lpx_op_register(schema, out);
}

static lpx_status h_kind(const lpx_host *h, const lpx_kind_i *vt, const lpx_kind **out)
{
    lpx_status st = host_check(h, "kind_register");
    return st ? st : lpx_kind_register(vt, out);
}

static lpx_status h_kernel(const lpx_host *h, lpx_op op, int key, lpx_kernel_fn fn, void *data)
{
    lpx_status st = host_check(h, "kernel_register");
    return st ? st : lpx_kernel_register(op, key, fn, data);
}

static lpx_status h_typed(const lpx_host *h, lpx_op op, int key, const char *sig, void (*fn)(void))
{
    lpx_status st = host_check(h, "kernel_register_typed");
    return st ? st : lpx_kernel_register_typed(op, key, sig, fn);
}

static lpx_status h_fallback(const lpx_host *h, int key, lpx_kernel_fn fn, void *data)
{
    lpx_status st = host_check(h, "fallback_register");
    return st ? st : lpx_fallback_register(key, fn, data);
}

static lpx_status h_backend(const lpx_host *h, const lpx_backend_i *b, int *key)
{
    lpx_status st = host_check(h, "backend_register");
    return st ? st : lpx_backend_register(b, key);
}

void lpx_host_init(lpx_plugin *p)
{
    lpx_host *h = &p->host;
    h->struct_size = sizeof *h;
    h->abi_major = LPX_PLUGIN_ABI_MAJOR;
    h->abi_minor = LPX_PLUGIN_ABI_MINOR;
    h->lpx_version = lpx_version();
    h->plugin_path = p->path;
    h->loader = p;
    h->dtype_register = h_dtype;
    h->op_register = h_op;
    h->kind_register = h_kind;
    h->kernel_register = h_kernel;
    h->kernel_register_typed = h_typed;
    h->fallback_register = h_fallback;
    h->backend_register = h_backend;
}
