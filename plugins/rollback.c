/* Undoing a failed plugin load: the journal's records (core/journal.c),
 * replayed newest first through each layer's unregister function. Lives
 * with the loader because it names every layer below it. */
#include "plugin_internal.h"

void lpx_journal_rollback(lpx_journal *j)
{
    for (int i = j->n - 1; i >= 0; i--) {
        const lpx_journal_entry *e = &j->v[i];
        switch (e->what) {
        case LPX_REG_KERNEL: (void)lpx_kernel_unregister(e->a, e->b); break;
        case LPX_REG_FALLBACK: (void)lpx_fallback_unregister(e->a); break;
        case LPX_REG_KIND: (void)lpx__kind_unregister_force(e->p); break;
        case LPX_REG_OP: (void)lpx__op_unregister(e->a); break;
        case LPX_REG_BACKEND: /* its kernels first: no dispatch may find one for a gone backend */
            lpx__key_retire(e->a);
            (void)lpx__backend_unregister(e->a);
            break;
        case LPX_REG_DTYPE: (void)lpx__dtype_unregister(e->a); break;
        case LPX_REG_COMM_BACKEND: lpx__comm_backend_unregister(e->a); break;
        }
    }
    j->n = 0;
}

