/* The registration journal's records. Registration functions
 * (dispatch/registry.c, core/dtype.c, core/backends.c, comm) call lpx__journal_reserve before changing anything and
 * lpx__journal_note after they succeeded; while a plugin loads, its
 * thread's journal records each one, so a failed load can be undone
 * exactly, newest first (plugins/rollback.c). Reserving first means the note never fails: a
 * registration is either refused or recorded, never made and forgotten. */
#include <string.h>
#include "journal.h"

static _Thread_local lpx_journal *current;

lpx_status lpx_journal_open(lpx_journal *j, lpx_journal_gate gate, void *ctx)
{
    if (current)
        return lpx_error(LPX_EPLUGIN, "plugin loader: a plugin load is already in progress on this thread "
                                      "(a plugin's init may not load plugins)");
    memset(j, 0, sizeof *j);
    j->gate = gate;
    j->gate_ctx = ctx;
    current = j;
    return LPX_OK;
}

void lpx_journal_close(lpx_journal *j)
{
    if (current == j) current = NULL;
}

bool lpx_journal_active(void) { return current != NULL; }

lpx_status lpx__journal_reserve(const char *what)
{
    lpx_journal *j = current;
    if (LPX_LIKELY(!j)) return LPX_OK;
    if (j->gate) {
        lpx_status st = j->gate(j->gate_ctx, what);
        if (st) return st;
    }
    if (j->n < j->cap) return LPX_OK;
    int cap = j->cap ? 2 * j->cap : 16;
    lpx_journal_entry *v = lpx_realloc(j->v, (size_t)cap * sizeof *v);
    if (!v) return lpx_error(LPX_ENOMEM, "%s: cannot grow the plugin load journal", what);
    j->v = v;
    j->cap = cap;
    return LPX_OK;
}

void lpx__journal_note(lpx_reg_what what, int a, int b, const void *p)
{
    lpx_journal *j = current;
    if (LPX_LIKELY(!j)) return;
    /* reserve guaranteed the room; a register function that forgot to
     * reserve is a bug in lpx, not in the plugin */
    LPX_ASSERT(j->n < j->cap);
    j->v[j->n++] = (lpx_journal_entry){what, a, b, p};
}

int lpx_journal_count(const lpx_journal *j, lpx_reg_what what)
{
    int n = 0;
    for (int i = 0; i < j->n; i++) n += j->v[i].what == what;
    return n;
}

void lpx_journal_free(lpx_journal *j)
{
    lpx_free(j->v);
    j->v = NULL;
    j->n = j->cap = 0;
}
