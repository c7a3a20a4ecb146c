/* Out-of-memory behaviour of every public entry point (docs/RELIABILITY.md).
 *
 * Each case of tests/oom_*.c sweeps one entry point: the call runs with its
 * 1st, 2nd, ... allocation failing (and every later one) until it
 * succeeds. Every attempt must return LPX_OK or LPX_ENOMEM with a message,
 * keep the API's promises on failure (outputs NULL, ownership unchanged,
 * nothing half-registered), leave the registries' counts and every kind's
 * live-tensor count as they were, and leak nothing: LeakSanitizer checks
 * the whole run in the ASan build; in a normal build the glibc heap's
 * in-use bytes (mallinfo2, main thread) must be back where they were after
 * each non-registering case. After each case a small probe checks that
 * ops, the registries and a sentinel tensor still work.
 *
 * Coverage: the public functions are read from the headers of include/lpx/ at run time
 * ($LPX_TEST_SRC, set by tests/meson.build). Each must be swept by a case
 * or listed in `skipped` below with the reason; a function in neither (a
 * newly added API) fails the test by name. Prints one line per case and a
 * total: entry points swept, injected failures, skipped functions. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "oom.h"

#if defined(__SANITIZE_ADDRESS__)
#define OOM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OOM_ASAN 1
#endif
#endif
#ifndef OOM_ASAN
#define OOM_ASAN 0
#endif

/* ---- the skip table ---------------------------------------------------
 * Public functions the sweep does not call, with the reason. Keep it
 * honest: a function that can allocate belongs in a case, not here. */
#define NOALLOC "reads or sets a field, never allocates"
#define FREES "releases or frees, never allocates (runs in every case's cleanup)"
static const struct {
    const char *fn;
    const char *why;
} skipped[] = {
    /* status.h: a thread-local fixed buffer */
    {"lpx_status_string", NOALLOC}, {"lpx_last_error", NOALLOC}, {"lpx_clear_error", NOALLOC},
    {"lpx_error", "formats into the thread-local 1 KiB buffer, never allocates"},
    /* lpx.h */
    {"lpx_version", NOALLOC}, {"lpx_version_number", NOALLOC},
    {"lpx_meta_rope", NOALLOC}, {"lpx_meta_attention", NOALLOC}, {"lpx_meta_attention_backward", NOALLOC},
    {"lpx_meta_same_shape", NOALLOC}, {"lpx_meta_lines", NOALLOC}, {"lpx_meta_rmsnorm", NOALLOC},
    {"lpx_meta_rmsnorm_backward", NOALLOC}, {"lpx_meta_swiglu_backward", NOALLOC},
    {"lpx_meta_cross_entropy_dtype", NOALLOC},
    {"lpx_meta_broadcast", NOALLOC}, {"lpx_meta_out", NOALLOC}, {"lpx_meta_dim", NOALLOC}, {"lpx_meta_reduce", NOALLOC},
    {"lpx_meta_nf4_blocks", NOALLOC}, {"lpx_meta_nf4_payload", NOALLOC}, {"lpx_meta_nf4_range", NOALLOC},
    {"lpx_meta_adamw", NOALLOC}, {"lpx_meta_matmul", NOALLOC}, {"lpx_meta_linear", NOALLOC},
    {"lpx_meta_addmm", NOALLOC}, {"lpx_meta_indices", NOALLOC}, {"lpx_meta_cross_entropy", NOALLOC},
    {"lpx_meta_embedding", NOALLOC}, {"lpx_meta_embedding_backward", NOALLOC},
    {"lpx_meta_shape_arg", NOALLOC}, {"lpx_meta_arange", NOALLOC}, {"lpx_meta_random", NOALLOC},
    {"lpx_meta_cast", NOALLOC}, {"lpx_meta_copy", NOALLOC}, {"lpx_meta_fill", NOALLOC},
    {"lpx_meta_fp8_dtype", NOALLOC}, {"lpx_meta_fp8_scaled_mm", NOALLOC}, {"lpx_meta_fp8_quantize", NOALLOC},
    {"lpx_meta_fp8_dequantize", NOALLOC}, {"lpx_meta_fp8_block_grid", NOALLOC},
    {"lpx_meta_fp8_quantize_block", NOALLOC}, {"lpx_meta_fp8_dequantize_block", NOALLOC},
    {"lpx_meta_fp8_mm_block", NOALLOC}, {"lpx_meta_fp8_scale_from_amax", NOALLOC}, {"lpx_meta_nf4_quantize", NOALLOC}, {"lpx_meta_nf4_mm", NOALLOC}, {"lpx_meta_qlora_dropout", NOALLOC},
    {"lpx_init", "not applicable: runs once per process, before the sweep; every entry point reports an init "
                 "failure as its own status"},
    /* dtype.h */
    {"lpx_dtype_get", NOALLOC}, {"lpx_dtype_name", NOALLOC}, {"lpx_dtype_from_name", NOALLOC},
    {"lpx_dtype_count", NOALLOC}, {"lpx_dtype_nbytes", NOALLOC}, {"lpx_dtype_valid", NOALLOC},
    /* tensor.h */
    {"lpx_cpu", NOALLOC}, {"lpx_tensor_retain", NOALLOC}, {"lpx_tensor_release", FREES},
    {"lpx_tensor_ndim", NOALLOC}, {"lpx_tensor_shape", NOALLOC}, {"lpx_tensor_strides", NOALLOC},
    {"lpx_tensor_offset", NOALLOC}, {"lpx_tensor_numel", NOALLOC}, {"lpx_tensor_dtype", NOALLOC},
    {"lpx_tensor_device", NOALLOC}, {"lpx_tensor_kind", NOALLOC}, {"lpx_tensor_data", NOALLOC},
    {"lpx_tensor_is_contiguous", NOALLOC}, {"lpx_tensor_keys", NOALLOC}, {"lpx_tensor_refcount", NOALLOC},
    {"lpx_tensor_shares_storage", NOALLOC}, {"lpx_tensor_is_readonly", NOALLOC},
    {"lpx_tensor_mark_readonly", NOALLOC}, {"lpx_tensor_inner_count", NOALLOC}, {"lpx_tensor_inner", NOALLOC},
    {"lpx_tensor_meta", NOALLOC}, {"lpx_tensor_shape_str", "formats into the caller's buffer"},
    /* dispatch.h */
    {"lpx_call_release_rets", FREES}, {"lpx_op_name", NOALLOC}, {"lpx_op_schema", NOALLOC},
    {"lpx_op_count", NOALLOC}, {"lpx_op_nargs", NOALLOC}, {"lpx_op_nrets", NOALLOC},
    {"lpx_op_spec_run", NOALLOC}, {"lpx_op_spec_size", NOALLOC},
    {"lpx_kernel_exists", NOALLOC}, {"lpx_key_name", NOALLOC}, {"lpx_device_key", NOALLOC},
    {"lpx_backend_for", NOALLOC}, {"lpx_backend_count", NOALLOC}, {"lpx_backend_at", NOALLOC},
    /* kind.h */
    {"lpx_kind_name", NOALLOC}, {"lpx_kind_key", NOALLOC}, {"lpx_kind_vtable", NOALLOC}, {"lpx_kind_user", NOALLOC},
    {"lpx_kind_live_tensors", NOALLOC}, {"lpx_kind_count", NOALLOC}, {"lpx_kind_at", NOALLOC},
    /* trace.h */
    {"lpx_trace_enabled", NOALLOC}, {"lpx_trace_count", NOALLOC}, {"lpx_trace_fallback_count", NOALLOC},
    {"lpx_trace_ns", NOALLOC}, {"lpx_now_ns", NOALLOC},
    /* comm.h */
    {"lpx_coll_name", NOALLOC}, {"lpx_reduce_op_name", NOALLOC},
    {"lpx_comm_abort", "marks the group failed in place (fixed-size reason buffer), never allocates"},
    {"lpx_comm_rank", NOALLOC}, {"lpx_comm_size", NOALLOC}, {"lpx_comm_backend_name", NOALLOC},
    {"lpx_comm_backend_state", NOALLOC}, {"lpx_comm_caps_get", NOALLOC},
    {"lpx_comm_all_gather_host", "forwards to a backend's optional slot; the built-in comms have none (LPX_ENOTIMPL)"},
    {"lpx_comm_wait_ticket", "forwards to a backend's optional slot; the built-in comms have none (LPX_ENOTIMPL)"},
    {"lpx_comm_sync_ticket", "forwards to a backend's optional slot; the built-in comms have none (LPX_ENOTIMPL)"},
    {"lpx_comm_timeout", NOALLOC}, {"lpx_comm_destroy", FREES}, {"lpx_comm_stats_reset", NOALLOC},
    {"lpx_comm_stats_print", "prints counters with fprintf, never allocates"},
    {"lpx_comm_backend_count", NOALLOC}, {"lpx_comm_backend_at", NOALLOC},
    /* dtensor.h */
    {"lpx_mesh_retain", NOALLOC}, {"lpx_mesh_release", FREES}, {"lpx_mesh_ndim", NOALLOC},
    {"lpx_mesh_comm", NOALLOC}, {"lpx_mesh_size", NOALLOC}, {"lpx_mesh_rank", NOALLOC},
    {"lpx_mesh_refcount", NOALLOC}, {"lpx_dtensor_kind", NOALLOC}, {"lpx_dtensor_is", NOALLOC},
    {"lpx_dtensor_local", NOALLOC}, {"lpx_dtensor_mesh", NOALLOC},
    /* safetensors.h */
    {"lpx_output_path", "stats and reads links into stack buffers, never allocates"},
    /* fsdp.h */
    {"lpx_fsdp_free", FREES}, {"lpx_fsdp_ckpt_close", FREES}, {"lpx_fsdp_ckpt_world", NOALLOC},
    {"lpx_fsdp_ckpt_user", NOALLOC}, {"lpx_fsdp_ckpt_param_count", NOALLOC}, {"lpx_fsdp_group_count", NOALLOC}, {"lpx_fsdp_group_at", NOALLOC},
    {"lpx_fsdp_group_name", NOALLOC}, {"lpx_fsdp_param_count", NOALLOC}, {"lpx_fsdp_is_unsharded", NOALLOC},
    {"lpx_fsdp_param_full", NOALLOC}, {"lpx_fsdp_param_dtensor", NOALLOC}, {"lpx_fsdp_param_local", NOALLOC},
    {"lpx_fsdp_param_grad", NOALLOC}, {"lpx_adamw_opts_default", NOALLOC}, {"lpx_fsdp_stats_reset", NOALLOC},
    {"lpx_fsdp_placement_get", NOALLOC}, {"lpx_fsdp_grad_codec", NOALLOC},
    {"lpx_grad_codec_register", "copies into a fixed table, never allocates"},
    {"lpx_grad_codec_unregister", "clears a fixed table entry, never allocates"},
    {"lpx_grad_codec_find", "reads a fixed table, never allocates"},
    {"lpx_float8_weight_kind", NOALLOC}, {"lpx_float8_weight_is", NOALLOC}, {"lpx_float8_weight_master", NOALLOC},
    {"lpx_float8_weight_fp8", NOALLOC}, {"lpx_float8_weight_rowwise", NOALLOC},
    {"lpx_float8_weight_blockwise", NOALLOC},
    {"lpx_fsdp_param_name", NOALLOC}, {"lpx_fsdp_param_flags", NOALLOC}, {"lpx_fsdp_param_rows", NOALLOC}, {"lpx_float8_weight_scale", NOALLOC},
    /* float8.h */
    {"lpx_float8_delayed_free", FREES}, {"lpx_float8_delayed_scale", NOALLOC}, {"lpx_float8_delayed_steps", NOALLOC},
    {"lpx_float8_delayed_history", NOALLOC}, {"lpx_float8_kind", NOALLOC}, {"lpx_float8_is", NOALLOC},
    {"lpx_float8_data", NOALLOC}, {"lpx_float8_block_shape", NOALLOC}, {"lpx_float8_scale", NOALLOC}, {"lpx_float8_scale_inv", NOALLOC},
    {"lpx_float8_fallback_enabled", NOALLOC}, {"lpx_float8_linear_state_destroy", FREES},
    {"lpx_float8_linear_ctx_free", FREES},
    /* nf4.h */
    {"lpx_optim_state_default_block", NOALLOC}, {"lpx_optim_state_kind", NOALLOC}, {"lpx_is_optim_state", NOALLOC},
    {"lpx_optim_state_get_info", NOALLOC}, {"lpx_optim_adamw_opts_default", NOALLOC},
    {"lpx_nf4_config_default", NOALLOC}, {"lpx_nf4_config_resolve", NOALLOC}, {"lpx_nf4_kind", NOALLOC}, {"lpx_nf4_is", NOALLOC},
    {"lpx_qlora_opts_default", NOALLOC}, {"lpx_nf4_set_fallback", "an atomic flag, never allocates"},
    {"lpx_nf4_fallback_enabled", NOALLOC},
    /* plugin.h */
    {"lpx_plugin_unload", "not applicable: always refused (LPX_ENOTIMPL), allocates nothing"},
    {"lpx_plugin_count", NOALLOC}, {"lpx_plugin_at", NOALLOC}, {"lpx_plugin_name", NOALLOC},
    {"lpx_plugin_version", NOALLOC}, {"lpx_plugin_description", NOALLOC}, {"lpx_plugin_path", NOALLOC},
    {"lpx_plugin_symbol", "dlsym on the plugin's handle, never allocates through lpx"},
    {"lpx_plugin_abi", NOALLOC}, {"lpx_plugin_registered", NOALLOC}, {"lpx_plugin_skipped_count", NOALLOC},
    {"lpx_plugin_skipped_path", NOALLOC}, {"lpx_plugin_skipped_reason", NOALLOC},
    /* dlpack.h */
    {"lpx_kind_inner_name", "formats into the caller's buffer"}, {"lpx_dlpack_capsule_destructor", "calls a deleter, never allocates"}, {"lpx_dlpack_flat_release", FREES},
    /* safetensors.h */
    {"lpx_safetensors_close", FREES}, {"lpx_safetensors_count", NOALLOC}, {"lpx_safetensors_name", NOALLOC},
    {"lpx_safetensors_kind_of", NOALLOC}, {"lpx_safetensors_metadata", NOALLOC},
    {"lpx_safetensors_metadata_count", NOALLOC}, {"lpx_safetensors_metadata_at", NOALLOC},
    {"lpx_safetensors_dtype_name", NOALLOC},
};
#define NSKIPPED (int)(sizeof skipped / sizeof skipped[0])

/* ---- arming and failure reporting ------------------------------------ */

static long cur_countdown = -1;   /* the attempt being run; -1: never fail */
static _Atomic int armed_calls;   /* OOM() regions entered during an attempt */
lpx_status oom_last;
/* the message of the last failed OOM() call, taken when it returned (the
 * case's later checks may overwrite lpx_last_error) */
static char call_msg[1024];
static bool call_msg_valid;

void oom_arm(void)
{
    armed_calls++;
    lpx__fail_alloc_after(cur_countdown);
}

void oom_disarm(void)
{
    lpx__fail_alloc_after(-1);
    if (oom_last != LPX_OK) {
        snprintf(call_msg, sizeof call_msg, "%s", lpx_last_error());
        call_msg_valid = true;
    }
}

static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static int case_failures;
static const char *cur_case = "?";

void oom_failf(const char *file, int line, const char *fmt, ...)
{
    pthread_mutex_lock(&fail_lock);
    case_failures++;
    fprintf(stderr, "  %s:%d: %s, attempt %ld: ", file, line, cur_case, cur_countdown);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&fail_lock);
}

static char tmpdir[256];

const char *oom_tmpdir(void) { return tmpdir; }

lpx_tensor *oom_randn2(int64_t rows, int64_t cols, uint64_t seed, lpx_dtype dtype)
{
    int64_t shape[2] = {rows, cols};
    lpx_tensor *t = NULL;
    if (lpx_randn(2, shape, seed, dtype, lpx_cpu(), &t))
        oom_failf(__FILE__, __LINE__, "setup randn: %s", lpx_last_error());
    return t;
}

lpx_tensor *oom_randn1(int64_t n, uint64_t seed, lpx_dtype dtype)
{
    lpx_tensor *t = NULL;
    if (lpx_randn(1, &n, seed, dtype, lpx_cpu(), &t)) oom_failf(__FILE__, __LINE__, "setup randn: %s", lpx_last_error());
    return t;
}

/* ---- rank cases -------------------------------------------------------- */

#define MAX_RANKS 4

typedef struct ranks_ctx {
    const oom_ranks *r;
    pthread_barrier_t bar;
    lpx_status st[MAX_RANKS];
    char msg[MAX_RANKS][512];
} ranks_ctx;

static lpx_status rank_body(lpx_comm *comm, void *p)
{
    ranks_ctx *c = p;
    const oom_ranks *r = c->r;
    int rank = lpx_comm_rank(comm);
    _Alignas(16) unsigned char state[1024];
    memset(state, 0, sizeof state);
    lpx_status sst = r->setup ? r->setup(comm, rank, state) : LPX_OK;
    if (sst) oom_failf(__FILE__, __LINE__, "rank %d setup: %s (%s)", rank, lpx_status_string(sst), lpx_last_error());
    /* every rank passes every barrier, whatever happened */
    pthread_barrier_wait(&c->bar);
    if (rank == 0) oom_arm();
    pthread_barrier_wait(&c->bar);
    lpx_status st = sst;
    if (!sst) {
        lpx_clear_error();
        st = r->call(comm, rank, state);
        if (st) {
            snprintf(c->msg[rank], sizeof c->msg[rank], "%s", lpx_last_error());
            lpx_comm_abort(comm, "out of memory in the sweep");   /* peers fail now, not at their deadline */
        }
    }
    c->st[rank] = st;
    pthread_barrier_wait(&c->bar);
    if (rank == 0) oom_disarm();
    pthread_barrier_wait(&c->bar);
    if (r->cleanup) r->cleanup(comm, rank, state, st);
    return LPX_OK;   /* statuses travel in c->st: the group is not aborted by the harness */
}

lpx_status oom_run_ranks(const oom_ranks *r)
{
    if (r->nranks < 1 || r->nranks > MAX_RANKS || r->state_size > 1024) {
        oom_failf(__FILE__, __LINE__, "bad oom_ranks");
        return LPX_EINVAL;
    }
    ranks_ctx c;
    memset(&c, 0, sizeof c);
    c.r = r;
    pthread_barrier_init(&c.bar, NULL, (unsigned)r->nranks);
    lpx_status rst = lpx_local_run(r->nranks, rank_body, &c, 20000, NULL);
    pthread_barrier_destroy(&c.bar);
    if (rst) {
        oom_failf(__FILE__, __LINE__, "lpx_local_run: %s (%s)", lpx_status_string(rst), lpx_last_error());
        return rst;
    }
    int nomem = -1, bad = -1;
    for (int i = 0; i < r->nranks; i++) {
        if (c.st[i] == LPX_ENOMEM && nomem < 0) nomem = i;
        if (c.st[i] != LPX_OK && c.st[i] != LPX_ENOMEM && c.st[i] != LPX_ECOMM && bad < 0) bad = i;
    }
    if (bad >= 0) {
        lpx_error(c.st[bad], "rank %d: %s", bad, c.msg[bad]);
        return c.st[bad];
    }
    if (nomem >= 0) {
        for (int i = 0; i < r->nranks; i++)
            OOM_CHECKF(c.st[i] != LPX_ECOMM || c.msg[i][0], "rank %d: LPX_ECOMM without a message", i);
        lpx_error(LPX_ENOMEM, "rank %d: %s", nomem, c.msg[nomem]);
        return LPX_ENOMEM;
    }
    for (int i = 0; i < r->nranks; i++)
        if (c.st[i] == LPX_ECOMM) {   /* a comm failure with no rank out of memory */
            lpx_error(LPX_ECOMM, "rank %d: %s", i, c.msg[i]);
            return LPX_ECOMM;
        }
    return LPX_OK;
}

/* ---- invariants between attempts ---------------------------------------- */

#define MAX_KINDS 64

typedef struct snapshot {
    int ops, kinds, dtypes, backends, plugins, comm_backends;
    int64_t live[MAX_KINDS];
} snapshot;

static void take(snapshot *s)
{
    memset(s, 0, sizeof *s);
    s->ops = lpx_op_count();
    s->kinds = lpx_kind_count();
    s->dtypes = lpx_dtype_count();
    s->backends = lpx_backend_count();
    s->plugins = lpx_plugin_count();
    s->comm_backends = lpx_comm_backend_count();
    for (int i = 0; i < s->kinds && i < MAX_KINDS; i++) s->live[i] = lpx_kind_live_tensors(lpx_kind_at(i));
}

/* what changed between a and b, or NULL */
static const char *changed(const snapshot *a, const snapshot *b, char *buf, size_t len)
{
    if (a->ops != b->ops) snprintf(buf, len, "op count %d -> %d", a->ops, b->ops);
    else if (a->kinds != b->kinds) snprintf(buf, len, "kind count %d -> %d", a->kinds, b->kinds);
    else if (a->dtypes != b->dtypes) snprintf(buf, len, "dtype count %d -> %d", a->dtypes, b->dtypes);
    else if (a->backends != b->backends) snprintf(buf, len, "backend count %d -> %d", a->backends, b->backends);
    else if (a->plugins != b->plugins) snprintf(buf, len, "plugin count %d -> %d", a->plugins, b->plugins);
    else if (a->comm_backends != b->comm_backends)
        snprintf(buf, len, "comm backend count %d -> %d", a->comm_backends, b->comm_backends);
    else {
        for (int i = 0; i < a->kinds && i < MAX_KINDS; i++)
            if (a->live[i] != b->live[i]) {
                snprintf(buf, len, "live tensors of kind %s %lld -> %lld", lpx_kind_name(lpx_kind_at(i)),
                         (long long)a->live[i], (long long)b->live[i]);
                return buf;
            }
        return NULL;
    }
    return buf;
}

/* The sentinel: a tensor made before the sweep, checked after every case. */
static lpx_tensor *sentinel;

static void probe_usable(void)
{
    int64_t shape[1] = {5};
    lpx_tensor *a = NULL, *b = NULL;
    double v = 0;
    lpx_status st = lpx_full(1, shape, 2.0, LPX_F32, lpx_cpu(), &a);
    if (!st) st = lpx_add(a, sentinel, &b);
    if (!st) st = lpx_item(b, 4, &v);
    OOM_CHECKF(!st && v == 2.0 + 4.0, "after the case, ops fail: %s (%s)", lpx_status_string(st), lpx_last_error());
    lpx_tensor_release(a);
    lpx_tensor_release(b);
    lpx_op op;
    const lpx_kind *k;
    OOM_CHECK(lpx_op_find("add", &op) == LPX_OK && op == LPX_OP_add);
    OOM_CHECK(lpx_kind_find("nf4", &k) == LPX_OK && k == lpx_nf4_kind());
    OOM_CHECK(lpx_tensor_refcount(sentinel) == 1);
    for (int i = 0; i < 5; i++) OOM_CHECK(lpx_item(sentinel, i, &v) == LPX_OK && v == (double)i);
}

/* ---- the sweep ----------------------------------------------------------- */

#define MAX_ATTEMPTS 3000
#define MAX_FNS 512

static struct {
    const char *fn;
    long injected;
    int cases;
} swept[MAX_FNS];
static int nswept;
static long total_injected;
static int total_cases, failed_cases;
static long long unbalanced_bytes;

static void note_swept(const char *fn, long injected)
{
    for (int i = 0; i < nswept; i++)
        if (!strcmp(swept[i].fn, fn)) {
            swept[i].injected += injected;
            swept[i].cases++;
            return;
        }
    if (nswept < MAX_FNS) {
        swept[nswept].fn = fn;
        swept[nswept].injected = injected;
        swept[nswept].cases = 1;
        nswept++;
    }
}

/* Bytes the main thread's heap holds for live blocks. mallinfo2 counts
 * blocks parked in glibc's tcache and fastbins as in use, so main()
 * switches both off (GLIBC_TUNABLES, M_MXFAST) to make this exact. */
#if !OOM_ASAN
static bool heap_exact;
#endif

static size_t heap_in_use(void)
{
#if OOM_ASAN
    return 0;
#else
    return heap_exact ? mallinfo2().uordblks : 0;
#endif
}

static void run_case(const oom_case *c)
{
    char label[160];
    snprintf(label, sizeof label, "%s%s%s%s", c->fn, c->variant ? " [" : "", c->variant ? c->variant : "",
             c->variant ? "]" : "");
    cur_case = label;
    case_failures = 0;
    bool persistent = c->flags & OOM_PERSISTENT;
    /* a first, unarmed run makes whatever the library caches once */
    if (!persistent) {
        cur_countdown = -1;
        lpx_status st = c->run(-1);
        OOM_CHECKF(st == LPX_OK, "without injected failures: %s (%s)", lpx_status_string(st), lpx_last_error());
    }
    size_t heap0 = heap_in_use();
    long n = 0, injected = 0;
    bool done = false;
    for (; n < MAX_ATTEMPTS && !done && case_failures == 0; n++) {
        snapshot before, after;
        take(&before);
        cur_countdown = n;
        armed_calls = 0;
        call_msg_valid = false;
        oom_last = LPX_OK;
        lpx_clear_error();
        lpx_status st = c->run((int)n);
        lpx__fail_alloc_after(-1);
        const char *err = call_msg_valid && st == oom_last ? call_msg : lpx_last_error();
        if (getenv("LPX_OOM_DEBUG"))
            fprintf(stderr, "  %s attempt %ld: %s, heap %zu\n", label, n, lpx_status_string(st), heap_in_use());
        take(&after);
        char why[200];
        const char *diff = changed(&before, &after, why, sizeof why);
        OOM_CHECKF(armed_calls > 0, "the case returned %s before its call (%s)", lpx_status_string(st), err);
        if (st == LPX_OK) {
            done = true;
            if (!persistent) OOM_CHECKF(!diff, "the successful attempt changed the registries: %s", diff);
        } else if (st == LPX_ENOMEM) {
            injected++;
            OOM_CHECKF(err[0], "LPX_ENOMEM without a message");
            OOM_CHECKF(!diff, "a failed attempt changed the registries: %s", diff);
        } else {
            OOM_CHECKF(0, "returned %s (%s), not LPX_OK or LPX_ENOMEM", lpx_status_string(st), err);
        }
    }
    cur_countdown = -1;
    OOM_CHECKF(done || case_failures, "never succeeded in %d attempts", MAX_ATTEMPTS);
    size_t heap1 = heap_in_use();
    if (!persistent && heap1 != heap0) {
        unbalanced_bytes += (long long)heap1 - (long long)heap0;
        OOM_CHECKF(0, "heap in use %zu -> %zu bytes across the sweep (a leak or a cache that grows per call)",
                   heap0, heap1);
    }
    probe_usable();
    note_swept(c->fn, injected);
    total_injected += injected;
    total_cases++;
    if (case_failures) failed_cases++;
    printf("%s %-52s %5ld injected failure%s\n", case_failures ? "FAIL" : "ok  ", label, injected,
           injected == 1 ? "" : "s");
    fflush(stdout);
}

static void run_table(const oom_case *t)
{
    for (; t->fn; t++) run_case(t);
}

/* ---- coverage: the public functions of the headers in include/lpx/ ---------- */

typedef struct fn_entry {
    char name[96];
    char header[32];
} fn_entry;

static fn_entry public_fns[1024];
static int npublic;

/* Names declared `LPX_API ... lpx_name(` in one header (comments skipped). */
static void parse_header(const char *path, const char *base)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    /* blank out comments */
    for (size_t i = 0; i < got; i++) {
        if (s[i] == '/' && s[i + 1] == '*') {
            size_t j = i;
            while (j < got && !(s[j] == '*' && s[j + 1] == '/')) s[j++] = ' ';
            if (j < got) s[j] = s[j + 1] = ' ';
            i = j;
        } else if (s[i] == '/' && s[i + 1] == '/') {
            while (i < got && s[i] != '\n') s[i++] = ' ';
        }
    }
    for (char *p = s; (p = strstr(p, "LPX_API"));) {
        bool word = (p == s || !(isalnum((unsigned char)p[-1]) || p[-1] == '_')) &&
                    !(isalnum((unsigned char)p[7]) || p[7] == '_');
        p += 7;
        if (!word) continue;
        char *paren = strpbrk(p, "(;");
        if (!paren || *paren != '(') continue;
        char *e = paren;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n')) e--;
        char *b = e;
        while (b > p && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
        size_t len = (size_t)(e - b);
        if (len > 4 && len < sizeof public_fns[0].name && !strncmp(b, "lpx_", 4) && npublic < 1024) {
            memcpy(public_fns[npublic].name, b, len);
            public_fns[npublic].name[len] = 0;
            snprintf(public_fns[npublic].header, sizeof public_fns[npublic].header, "%s", base);
            npublic++;
        }
        p = paren;
    }
    free(s);
}

static int cmp_name(const void *a, const void *b) { return strcmp(((const fn_entry *)a)->name, ((const fn_entry *)b)->name); }

static void test_coverage(void)
{
    const char *src = getenv("LPX_TEST_SRC");
    CHECKF(src && src[0], "LPX_TEST_SRC (the source tree) is not set: run through meson test");
    if (!src || !src[0]) return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/include/lpx", src);
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot read %s: %s", dir, strerror(errno));
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 3 || strcmp(e->d_name + l - 2, ".h")) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        parse_header(path, e->d_name);
    }
    closedir(d);
    qsort(public_fns, (size_t)npublic, sizeof public_fns[0], cmp_name);
    CHECKF(npublic > 200, "only %d public functions parsed from %s", npublic, dir);
    int unlisted = 0, nskip_used = 0;
    for (int i = 0; i < npublic; i++) {
        const char *fn = public_fns[i].name;
        int is_swept = 0, is_skipped = 0;
        for (int k = 0; k < nswept; k++) is_swept |= !strcmp(swept[k].fn, fn);
        for (int k = 0; k < NSKIPPED; k++) is_skipped |= !strcmp(skipped[k].fn, fn);
        if (!is_swept && !is_skipped) {
            unlisted++;
            fprintf(stderr,
                    "  %s (include/lpx/%s) is public but the OOM sweep neither calls it nor skips it: add a case "
                    "to tests/oom_*.c, or, if it cannot allocate or cannot apply, an entry with the reason to "
                    "`skipped` in tests/test_oom.c\n",
                    fn, public_fns[i].header);
        }
        CHECKF(!(is_swept && is_skipped), "%s is both swept and in the skip table: drop the skip entry", fn);
        nskip_used += is_skipped;
    }
    CHECKF(unlisted == 0, "%d public function(s) not covered by the OOM sweep (listed above)", unlisted);
    /* stale entries: names that are no longer public */
    for (int k = 0; k < NSKIPPED + nswept; k++) {
        const char *fn = k < NSKIPPED ? skipped[k].fn : swept[k - NSKIPPED].fn;
        fn_entry key;
        snprintf(key.name, sizeof key.name, "%s", fn);
        CHECKF(bsearch(&key, public_fns, (size_t)npublic, sizeof public_fns[0], cmp_name) != NULL,
               "%s is %s by the OOM sweep but is not declared in include/lpx/ (renamed or removed?)", fn,
               k < NSKIPPED ? "skipped" : "swept");
    }
    int allocating = 0;
    for (int k = 0; k < nswept; k++) allocating += swept[k].injected > 0;
    printf("oom: %d public functions: %d entry points swept (%d of them allocate), %d skipped "
           "(never allocate or not applicable)\n", npublic, nswept, allocating, nskip_used);
    printf("oom: %d entry points, %d cases, %ld injected failures, %s\n", nswept, total_cases, total_injected,
           OOM_ASAN ? "leaks checked by LeakSanitizer at exit"
                    : (unbalanced_bytes ? "heap NOT back to baseline (see above)" : "0 leaked bytes (heap back to "
                                                                                    "baseline after every case)"));
}

/* ---- driver ----------------------------------------------------------------- */

static void test_sweep(void)
{
    struct {
        const char *name;
        lpx_status (*init)(void);
        void (*fini)(void);
        const oom_case *cases;
    } groups[] = {
        {"core", oom_core_init, NULL, oom_cases_core},
        {"ops", oom_ops_init, oom_ops_fini, oom_cases_ops},
        {"kinds", oom_kinds_init, oom_kinds_fini, oom_cases_kinds},
        {"dist", NULL, NULL, oom_cases_dist},
        {"io", NULL, NULL, oom_cases_io},
        {"optim", NULL, NULL, oom_cases_optim},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        cur_case = groups[g].name;
        if (groups[g].init) {
            lpx_status st = groups[g].init();
            CHECKF(st == LPX_OK, "%s fixtures: %s (%s)", groups[g].name, lpx_status_string(st), lpx_last_error());
            if (st) continue;
        }
        run_table(groups[g].cases);
        if (groups[g].fini) groups[g].fini();
    }
    CHECKF(failed_cases == 0, "%d of %d cases failed (details above)", failed_cases, total_cases);
}

#define TUNABLES "glibc.malloc.tcache_count=0"

int main(int argc, char **argv)
{
    (void)argc;
#if !OOM_ASAN
    /* glibc reads its tunables at startup: run again with the tcache off */
    const char *tun = getenv("GLIBC_TUNABLES");
    if (!tun || !strstr(tun, TUNABLES)) {
        if (!getenv("LPX_OOM_REEXEC")) {
            setenv("GLIBC_TUNABLES", TUNABLES, 1);
            setenv("LPX_OOM_REEXEC", "1", 1);
            execv("/proc/self/exe", argv);
        }
        printf("oom: cannot switch glibc's tcache off: the heap balance is not checked\n");
    } else {
        heap_exact = mallopt(M_MXFAST, 0) == 1;
    }
#else
    (void)argv;
#endif
    CHECK_OK(lpx_init());
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lpx-oom-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
    int64_t shape[1] = {5};
    CHECK_OK(lpx_arange(0, 5, 1, LPX_F32, lpx_cpu(), &sentinel));
    printf("oom: sweeping (attempt n fails the (n+1)th allocation of the call and every later one)\n");
    fflush(stdout);
    (void)shape;
    RUN(test_sweep);
    RUN(test_coverage);
    lpx_tensor_release(sentinel);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmpdir);
    return CHECK_DONE();
}
