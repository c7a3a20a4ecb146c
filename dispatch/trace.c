/* Dispatch tracing: per-(op, key) counters and Chrome trace events.
 *
 * Why it exists: the classic bug of tensor-subclass stacks is silent double
 * dispatch (a wrapper that unwraps, calls the op on its inner tensors, and
 * ends up dispatching the dense op twice) and silent fallbacks. Counting
 * every kernel invocation per (op, key), nested ones included, makes both
 * visible in one table.
 *
 * Counters: one cell of four relaxed atomics per (op, key). A call updates
 * only its own cell, so many threads may dispatch at once; readers see a
 * consistent-enough snapshot (each counter is exact once threads are idle).
 *
 * Span events: each thread appends to its own buffer (a list of chunks that
 * only that thread writes). A slot is reserved and published when the span
 * begins, so a thread's buffer is in begin order: parents precede children,
 * which is what trace viewers want for nested "X" events. The end time is
 * stored last with release semantics; the writer skips spans still open.
 * A global atomic caps the number of events (memory stays bounded);
 * further spans are counted as dropped and reported.
 *
 * Sessions: lpx_trace_start bumps a generation number. A thread whose
 * buffer belongs to an older generation rewinds it itself on its next
 * event, so no thread ever writes into another thread's buffer. Buffers of
 * exited threads are kept until the next start (their events are still
 * written at stop), then freed. Everything is freed at exit. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dispatch_internal.h"

atomic_bool lpx__trace_on;

#define TRACE_CHUNK 4096                       /* events per buffer chunk */
#define TRACE_DEFAULT_MAX_EVENTS (1u << 20)    /* ~40 MB of events at most */

enum { EV_FALLBACK = 1u };

/* ---- counters ------------------------------------------------------ */

typedef struct trace_cell {
    _Atomic uint64_t calls;
    _Atomic uint64_t fallbacks;
    _Atomic uint64_t ns;       /* inner calls included */
    _Atomic uint64_t self_ns;  /* inner dispatched calls excluded */
} trace_cell;

/* 2 MB of zero pages; only rows of registered ops are ever touched. */
static trace_cell cells[LPX_MAX_OPS][LPX_NUM_KEYS];

/* Key names as they were when first seen in this session, so the table and
 * the JSON still name a kind that was unregistered before they were
 * written. Interned strings: stable until exit. */
static _Atomic(const char *) key_cat[LPX_NUM_KEYS];

/* ---- events -------------------------------------------------------- */

typedef struct trace_event {
    uint64_t ts_ns;
    _Atomic uint64_t end_ns;   /* 0 while the span is open */
    const char *name;          /* op name (lives as long as the op) or interned */
    const char *cat;           /* interned */
    uint32_t flags;
} trace_event;

typedef struct trace_chunk {
    struct trace_chunk *next;
    trace_event ev[TRACE_CHUNK];
} trace_chunk;

typedef struct trace_thread {
    struct trace_thread *next;  /* all_threads list, under trace_mutex */
    uint32_t tid;               /* small number for the JSON track */
    atomic_bool dead;           /* the thread has exited */
    atomic_uint gen;            /* session the buffer belongs to */
    atomic_size_t n;            /* events published in this session */
    trace_chunk *head;          /* written by the owner before publishing n */
    trace_chunk *cur;           /* owner only: chunk holding slot n */
} trace_thread;

typedef struct interned {
    struct interned *next;
    char s[];
} interned;

static pthread_mutex_t trace_mutex = PTHREAD_MUTEX_INITIALIZER;
static trace_thread *all_threads;          /* under trace_mutex */
static interned *strings;                  /* under trace_mutex */
static char *json_path;                    /* under trace_mutex */
static bool env_mode;                      /* LPX_TRACE asked for a table at exit */
static bool exit_registered;
static bool shut_down;                     /* atexit cleanup ran */

static atomic_uint session_gen = 1;
static atomic_bool spans_on;               /* recording events for a JSON file */
static _Atomic uint64_t nevents;           /* reserved in this session */
static _Atomic uint64_t ndropped;
static _Atomic uint64_t max_events = TRACE_DEFAULT_MAX_EVENTS;
static atomic_uint next_tid = 1;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t thread_key;
static bool thread_key_ok;

static _Thread_local trace_thread *tls_thread;
static _Thread_local uint64_t tls_child_ns;   /* time of dispatched children */

uint64_t lpx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* Copy of s that lives until exit; caller holds trace_mutex. NULL on OOM. */
static const char *intern_locked(const char *s)
{
    if (!s) s = "";
    for (interned *i = strings; i; i = i->next)
        if (!strcmp(i->s, s)) return i->s;
    size_t n = strlen(s) + 1;
    interned *i = lpx_malloc(sizeof *i + n);
    if (!i) return NULL;
    memcpy(i->s, s, n);
    i->next = strings;
    strings = i;
    return i->s;
}

/* The session's name for key, snapshotted on first use. */
static const char *key_category(int key)
{
    const char *c = atomic_load_explicit(&key_cat[key], memory_order_acquire);
    if (LPX_LIKELY(c)) return c;
    pthread_mutex_lock(&trace_mutex);
    c = atomic_load_explicit(&key_cat[key], memory_order_relaxed);
    if (!c && (c = intern_locked(lpx_key_name(key))))
        atomic_store_explicit(&key_cat[key], c, memory_order_release);
    pthread_mutex_unlock(&trace_mutex);
    return c ? c : "?";
}

static void thread_exit(void *p)
{
    trace_thread *t = p;
    atomic_store_explicit(&t->dead, true, memory_order_release);
    if (tls_thread == t) tls_thread = NULL;
}

static void make_key(void) { thread_key_ok = pthread_key_create(&thread_key, thread_exit) == 0; }

/* This thread's record, created on first use; NULL on OOM or after exit
 * cleanup. */
static trace_thread *this_thread(void)
{
    if (LPX_LIKELY(tls_thread)) return tls_thread;
    pthread_once(&key_once, make_key);
    trace_thread *t = lpx_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->tid = atomic_fetch_add(&next_tid, 1);
    pthread_mutex_lock(&trace_mutex);
    if (shut_down) {
        pthread_mutex_unlock(&trace_mutex);
        lpx_free(t);
        return NULL;
    }
    atomic_store(&t->gen, atomic_load(&session_gen));
    t->next = all_threads;
    all_threads = t;
    pthread_mutex_unlock(&trace_mutex);
    if (thread_key_ok) pthread_setspecific(thread_key, t);
    tls_thread = t;
    return t;
}

/* Reserves and publishes the next event slot of this thread. Returns NULL
 * (and counts a drop) past the cap or on OOM. *gen receives the session
 * the slot belongs to, so a span that straddles a restart is not finished
 * into a reused slot. */
static trace_event *event_begin(uint64_t ts, const char *name, const char *cat, uint32_t flags, unsigned *gen)
{
    trace_thread *t = this_thread();
    if (!t) goto drop;
    unsigned g = atomic_load_explicit(&session_gen, memory_order_acquire);
    if (atomic_load_explicit(&t->gen, memory_order_relaxed) != g) {
        /* a new session: rewind our own buffer, keep the chunks */
        atomic_store_explicit(&t->n, 0, memory_order_relaxed);
        t->cur = t->head;
        atomic_store_explicit(&t->gen, g, memory_order_release);
    }
    if (atomic_fetch_add_explicit(&nevents, 1, memory_order_relaxed) >= atomic_load_explicit(&max_events, memory_order_relaxed)) goto drop;
    size_t i = atomic_load_explicit(&t->n, memory_order_relaxed);
    size_t slot = i % TRACE_CHUNK;
    if (!t->head) {
        if (!(t->head = lpx_malloc(sizeof *t->head))) goto drop;
        t->head->next = NULL;
        t->cur = t->head;
    } else if (slot == 0 && i > 0) {
        if (!t->cur->next) {
            trace_chunk *c = lpx_malloc(sizeof *c);
            if (!c) goto drop;
            c->next = NULL;
            t->cur->next = c;
        }
        t->cur = t->cur->next;
    }
    trace_event *e = &t->cur->ev[slot];
    e->ts_ns = ts;
    e->name = name;
    e->cat = cat;
    e->flags = flags;
    atomic_store_explicit(&e->end_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&t->n, i + 1, memory_order_release);
    *gen = g;
    return e;
drop:
    atomic_fetch_add_explicit(&ndropped, 1, memory_order_relaxed);
    return NULL;
}

static void event_end(trace_event *e, unsigned gen, uint64_t end)
{
    trace_thread *t = tls_thread;
    if (!e || !t || atomic_load_explicit(&t->gen, memory_order_relaxed) != gen) return;
    if (end == 0) end = 1;   /* 0 means "open" */
    atomic_store_explicit(&e->end_ns, end, memory_order_release);
}

/* ---- the dispatch hook --------------------------------------------- */

lpx_status lpx__trace_invoke(lpx_call *c, lpx_kernel_fn fn, bool fallback)
{
    const lpx_op op = c->op;
    const int key = c->key;
    const char *cat = key_category(key);
    unsigned gen0 = atomic_load_explicit(&session_gen, memory_order_relaxed);
    trace_event *e = NULL;
    unsigned egen = 0;
    uint64_t saved_child = tls_child_ns;
    tls_child_ns = 0;
    uint64_t t0 = lpx_now_ns();
    if (atomic_load_explicit(&spans_on, memory_order_relaxed))
        e = event_begin(t0, lpx__op_row(op)->schema.name, cat, fallback ? EV_FALLBACK : 0, &egen);
    lpx_status st = fn(c);
    uint64_t t1 = lpx_now_ns();
    uint64_t dur = t1 - t0, child = tls_child_ns;
    tls_child_ns = saved_child + dur;
    event_end(e, egen, t1);
    /* a call that straddles stop or a restart belongs to no session */
    if (atomic_load_explicit(&lpx__trace_on, memory_order_relaxed) &&
        atomic_load_explicit(&session_gen, memory_order_relaxed) == gen0) {
        trace_cell *cell = &cells[op][key];
        atomic_fetch_add_explicit(&cell->calls, 1, memory_order_relaxed);
        if (fallback) atomic_fetch_add_explicit(&cell->fallbacks, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&cell->ns, dur, memory_order_relaxed);
        atomic_fetch_add_explicit(&cell->self_ns, dur > child ? dur - child : 0, memory_order_relaxed);
    }
    return st;
}

void lpx_trace_span(const char *name, const char *category, uint64_t start_ns, uint64_t end_ns)
{
    if (!atomic_load_explicit(&spans_on, memory_order_relaxed)) return;
    pthread_mutex_lock(&trace_mutex);
    const char *n = intern_locked(name ? name : "span");
    const char *c = intern_locked(category ? category : "lpx");
    pthread_mutex_unlock(&trace_mutex);
    if (!n || !c) {
        atomic_fetch_add_explicit(&ndropped, 1, memory_order_relaxed);
        return;
    }
    unsigned g;
    trace_event *e = event_begin(start_ns, n, c, 0, &g);
    event_end(e, g, end_ns < start_ns ? start_ns : end_ns);
}

/* ---- JSON ---------------------------------------------------------- */

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* Microseconds with three decimals, exactly (no float rounding). */
static void json_us(FILE *f, uint64_t ns)
{
    fprintf(f, "%" PRIu64 ".%03u", ns / 1000, (unsigned)(ns % 1000));
}

/* Writes the session's events; caller holds trace_mutex. */
static lpx_status write_json_locked(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return lpx_error(LPX_EIO, "lpx_trace_stop: cannot write '%s': %s", path, strerror(errno));
    long pid = (long)getpid();
    unsigned g = atomic_load(&session_gen);
    fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":0,"
               "\"args\":{\"name\":\"lpx\"}}", pid);
    uint64_t written = 0;
    for (trace_thread *t = all_threads; t; t = t->next) {
        if (atomic_load_explicit(&t->gen, memory_order_acquire) != g) continue;
        size_t n = atomic_load_explicit(&t->n, memory_order_acquire);
        if (!n) continue;
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":%u,"
                   "\"args\":{\"name\":\"lpx thread %u\"}}", pid, t->tid, t->tid);
        trace_chunk *c = t->head;
        for (size_t i = 0; i < n && c; i++) {
            if (i > 0 && i % TRACE_CHUNK == 0) c = c->next;
            if (!c) break;
            const trace_event *e = &c->ev[i % TRACE_CHUNK];
            uint64_t end = atomic_load_explicit(&e->end_ns, memory_order_acquire);
            if (!end) continue;   /* still open: no duration to show */
            fputs(",\n{\"name\":", f);
            json_string(f, e->name);
            fputs(",\"cat\":", f);
            json_string(f, e->cat);
            fputs(",\"ph\":\"X\",\"ts\":", f);
            json_us(f, e->ts_ns);
            fputs(",\"dur\":", f);
            json_us(f, end - e->ts_ns);
            fprintf(f, ",\"pid\":%ld,\"tid\":%u", pid, t->tid);
            if (e->flags & EV_FALLBACK) fputs(",\"args\":{\"fallback\":true}", f);
            fputc('}', f);
            written++;
        }
    }
    fprintf(f, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"events\":%" PRIu64 ",\"dropped_events\":%" PRIu64 "}}\n",
            written, atomic_load(&ndropped));
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad) return lpx_error(LPX_EIO, "lpx_trace_stop: error while writing '%s'", path);
    return LPX_OK;
}

/* ---- sessions ------------------------------------------------------ */

static void free_thread(trace_thread *t)
{
    for (trace_chunk *c = t->head, *n; c; c = n) {
        n = c->next;
        lpx_free(c);
    }
    lpx_free(t);
}

static void trace_atexit(void);

/* LPX_TRACE_MAX_EVENTS, read at every start so a test can lower it. */
static uint64_t max_events_from_env(void)
{
    const char *cap = getenv("LPX_TRACE_MAX_EVENTS");
    if (!cap || !cap[0]) return TRACE_DEFAULT_MAX_EVENTS;
    char *end;
    unsigned long long m = strtoull(cap, &end, 10);
    if (*end == 0) return m;
    fprintf(stderr, "lpx: LPX_TRACE_MAX_EVENTS=%s is not a number; using %u\n", cap, TRACE_DEFAULT_MAX_EVENTS);
    return TRACE_DEFAULT_MAX_EVENTS;
}

lpx_status lpx_trace_start(const char *path)
{
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    char *copy = NULL;
    if (path && !(copy = lpx_strdup(path)))
        return lpx_error(LPX_ENOMEM, "lpx_trace_start: cannot copy the path");
    pthread_mutex_lock(&trace_mutex);
    if (shut_down) {
        pthread_mutex_unlock(&trace_mutex);
        lpx_free(copy);
        return lpx_error(LPX_EINVAL, "lpx_trace_start: called after exit cleanup");
    }
    if (!exit_registered) exit_registered = atexit(trace_atexit) == 0;
    atomic_store(&lpx__trace_on, false);
    atomic_store(&spans_on, false);
    atomic_fetch_add(&session_gen, 1);   /* every buffer is now stale */
    /* buffers of exited threads: nobody writes them any more */
    for (trace_thread **pp = &all_threads; *pp;) {
        trace_thread *t = *pp;
        if (atomic_load_explicit(&t->dead, memory_order_acquire)) {
            *pp = t->next;
            free_thread(t);
        } else {
            pp = &t->next;
        }
    }
    int nops = atomic_load(&lpx__nops);
    for (int op = 0; op < nops; op++)
        for (int k = 0; k < LPX_NUM_KEYS; k++) {
            trace_cell *c = &cells[op][k];
            atomic_store_explicit(&c->calls, 0, memory_order_relaxed);
            atomic_store_explicit(&c->fallbacks, 0, memory_order_relaxed);
            atomic_store_explicit(&c->ns, 0, memory_order_relaxed);
            atomic_store_explicit(&c->self_ns, 0, memory_order_relaxed);
        }
    for (int k = 0; k < LPX_NUM_KEYS; k++) atomic_store(&key_cat[k], NULL);
    atomic_store(&nevents, 0);
    atomic_store(&ndropped, 0);
    atomic_store(&max_events, max_events_from_env());
    lpx_free(json_path);
    json_path = copy;
    atomic_store(&spans_on, copy != NULL);
    atomic_store_explicit(&lpx__trace_on, true, memory_order_release);
    pthread_mutex_unlock(&trace_mutex);
    return LPX_OK;
}

static lpx_status stop_locked(void)
{
    if (!atomic_load(&lpx__trace_on)) return LPX_OK;
    atomic_store(&lpx__trace_on, false);
    atomic_store(&spans_on, false);
    lpx_status st = LPX_OK;
    if (json_path) {
        st = write_json_locked(json_path);
        lpx_free(json_path);
        json_path = NULL;
    }
    return st;
}

lpx_status lpx_trace_stop(void)
{
    pthread_mutex_lock(&trace_mutex);
    lpx_status st = stop_locked();
    pthread_mutex_unlock(&trace_mutex);
    return st;
}

bool lpx_trace_enabled(void) { return atomic_load_explicit(&lpx__trace_on, memory_order_relaxed); }

static trace_cell *cell_of(lpx_op op, int key)
{
    if (op < 0 || op >= LPX_MAX_OPS || key < 0 || key >= LPX_NUM_KEYS) return NULL;
    return &cells[op][key];
}

uint64_t lpx_trace_count(lpx_op op, int key)
{
    trace_cell *c = cell_of(op, key);
    return c ? atomic_load_explicit(&c->calls, memory_order_relaxed) : 0;
}

uint64_t lpx_trace_fallback_count(lpx_op op, int key)
{
    trace_cell *c = cell_of(op, key);
    return c ? atomic_load_explicit(&c->fallbacks, memory_order_relaxed) : 0;
}

uint64_t lpx_trace_ns(lpx_op op, int key)
{
    trace_cell *c = cell_of(op, key);
    return c ? atomic_load_explicit(&c->ns, memory_order_relaxed) : 0;
}

/* ---- the table ----------------------------------------------------- */

typedef struct row {
    lpx_op op;
    int key;
    uint64_t calls, fallbacks, ns, self_ns;
} row;

static int by_time_desc(const void *pa, const void *pb)
{
    const row *a = pa, *b = pb;
    if (a->ns != b->ns) return a->ns < b->ns ? 1 : -1;
    if (a->calls != b->calls) return a->calls < b->calls ? 1 : -1;
    if (a->op != b->op) return a->op < b->op ? -1 : 1;
    return b->key - a->key;   /* outer (higher) keys first */
}

void lpx_trace_print(FILE *f)
{
    if (!f) f = stderr;
    int nops = atomic_load(&lpx__nops);
    size_t nrows = 0, cap = 64;
    row *rows = lpx_malloc(cap * sizeof *rows);
    uint64_t total_calls = 0, total_fb = 0;
    for (int op = 0; op < nops; op++)
        for (int k = 0; k < LPX_NUM_KEYS; k++) {
            trace_cell *c = &cells[op][k];
            uint64_t calls = atomic_load_explicit(&c->calls, memory_order_relaxed);
            if (!calls) continue;
            row r = {op, k, calls, atomic_load_explicit(&c->fallbacks, memory_order_relaxed),
                     atomic_load_explicit(&c->ns, memory_order_relaxed),
                     atomic_load_explicit(&c->self_ns, memory_order_relaxed)};
            total_calls += r.calls;
            total_fb += r.fallbacks;
            if (!rows) continue;   /* OOM: totals only */
            if (nrows == cap) {
                row *g = lpx_realloc(rows, 2 * cap * sizeof *rows);
                if (!g) { lpx_free(rows); rows = NULL; continue; }
                rows = g;
                cap *= 2;
            }
            rows[nrows++] = r;
        }
    fprintf(f, "lpx trace: %" PRIu64 " dispatched calls, %" PRIu64 " through fallbacks", total_calls, total_fb);
    uint64_t dropped = atomic_load(&ndropped);
    if (dropped) fprintf(f, ", %" PRIu64 " span events dropped (cap %" PRIu64 ", LPX_TRACE_MAX_EVENTS)", dropped, atomic_load(&max_events));
    fputc('\n', f);
    if (!rows) {
        fprintf(f, "  (out of memory: table omitted)\n");
        return;
    }
    if (nrows) {
        qsort(rows, nrows, sizeof *rows, by_time_desc);
        fprintf(f, "%-24s %-16s %12s %10s %12s %12s %10s\n", "op", "key", "calls", "fallbacks", "total ms",
                "self ms", "avg ns");
        for (size_t i = 0; i < nrows; i++) {
            const row *r = &rows[i];
            const char *kn = atomic_load(&key_cat[r->key]);
            const char *on = lpx_op_name(r->op);
            fprintf(f, "%-24s %-16s %12" PRIu64 " %10" PRIu64 " %12.3f %12.3f %10.0f\n", on ? on : "?",
                    kn ? kn : lpx_key_name(r->key), r->calls, r->fallbacks, (double)r->ns / 1e6,
                    (double)r->self_ns / 1e6, (double)r->ns / (double)r->calls);
        }
        fprintf(f, "total includes nested dispatched calls (a wrapper's row contains its inner rows); "
                   "self excludes them.\n");
    }
    lpx_free(rows);
}

/* ---- environment and exit ------------------------------------------ */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

void lpx_trace_init_from_env(void)
{
    const char *v = getenv("LPX_TRACE");
    if (!v || !v[0] || !strcmp(v, "0")) return;
    bool json = ends_with(v, ".json");
    if (!json && strcmp(v, "1"))
        fprintf(stderr, "lpx: LPX_TRACE=%s: expected 1, 0 or FILE.json; counting calls\n", v);
    if (lpx_trace_start(json ? v : NULL)) {
        fprintf(stderr, "lpx: LPX_TRACE: %s\n", lpx_last_error());
        return;
    }
    pthread_mutex_lock(&trace_mutex);
    env_mode = true;
    pthread_mutex_unlock(&trace_mutex);
}

/* Writes what LPX_TRACE asked for, then frees every buffer (tests run
 * under LeakSanitizer). Threads still dispatching at exit are not
 * supported: their tracing stops with lpx__trace_on. */
static void trace_atexit(void)
{
    pthread_mutex_lock(&trace_mutex);
    bool was_on = atomic_load(&lpx__trace_on);
    char *path = json_path ? lpx_strdup(json_path) : NULL;
    lpx_status st = stop_locked();
    if (st) fprintf(stderr, "lpx: LPX_TRACE: %s\n", lpx_last_error());
    else if (env_mode && was_on && path) fprintf(stderr, "lpx: trace events written to %s\n", path);
    lpx_free(path);
    if (env_mode && was_on) lpx_trace_print(stderr);
    shut_down = true;
    for (trace_thread *t = all_threads, *n; t; t = n) {
        n = t->next;
        free_thread(t);
    }
    all_threads = NULL;
    tls_thread = NULL;
    for (int k = 0; k < LPX_NUM_KEYS; k++) atomic_store(&key_cat[k], NULL);
    for (interned *i = strings, *n; i; i = n) {
        n = i->next;
        lpx_free(i);
    }
    strings = NULL;
    if (thread_key_ok) {
        pthread_key_delete(thread_key);
        thread_key_ok = false;
    }
    pthread_mutex_unlock(&trace_mutex);
}

/* Bench hook (not stable API, like lpx__fail_alloc_after): the boxed kernel
 * registered for (op, key), so `lpx bench dispatch` can time a direct
 * kernel call against the dispatched one. NULL if none. */
LPX_API lpx_kernel_fn lpx__kernel_peek(lpx_op op, int key, void **data);
lpx_kernel_fn lpx__kernel_peek(lpx_op op, int key, void **data)
{
    if (op < 0 || op >= atomic_load(&lpx__nops) || key <= 0 || key >= LPX_NUM_KEYS) return NULL;
    lpx_kernel_entry *e = atomic_load_explicit(&lpx__op_row(op)->k[key], memory_order_acquire);
    if (data) *data = e ? e->data : NULL;
    return e ? e->fn : NULL;
}
