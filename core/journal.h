/* The registration journal's records (core/journal.c): while a plugin's
 * init runs, its thread has an open journal, and every registration
 * function (core, dispatch, comm) notes what it registered, so a failed
 * load can be undone. The undoing is the plugin loader's
 * (plugins/rollback.c): it calls the unregister functions of the layers
 * above core, which core may not name. Not installed. */
#ifndef LPX_CORE_JOURNAL_H
#define LPX_CORE_JOURNAL_H

#include "lpx_internal.h"

typedef struct lpx_journal_entry {
    lpx_reg_what what;
    int a, b;          /* dtype/op id/kind key/backend key; kernel: op, key */
    const void *p;     /* the registered object (kind handle, entry) */
} lpx_journal_entry;

/* Decides whether a registration may proceed (the loader checks that the
 * plugin declared this ABI and a free name first). Returns LPX_OK or an
 * error with its message set. */
typedef lpx_status (*lpx_journal_gate)(void *ctx, const char *what);

typedef struct lpx_journal {
    lpx_journal_entry *v;
    int n, cap;
    lpx_journal_gate gate;
    void *gate_ctx;
} lpx_journal;

/* Makes j the calling thread's open journal. LPX_EPLUGIN if one is open
 * already (a plugin's init loading another plugin). */
lpx_status lpx_journal_open(lpx_journal *j, lpx_journal_gate gate, void *ctx);
/* Detaches j from the thread; its entries stay for rollback or counting. */
void lpx_journal_close(lpx_journal *j);
/* True if the calling thread has an open journal. */
bool lpx_journal_active(void);
/* Number of entries of one kind. */
int lpx_journal_count(const lpx_journal *j, lpx_reg_what what);
void lpx_journal_free(lpx_journal *j);

#endif
