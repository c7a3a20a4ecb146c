/* Collectives over lpx-mpi.so, run as `test_comm_mpi NP`: the program
 * relaunches itself under `mpirun -np NP` (exit 77, skipped, when the
 * plugin was not built or no mpirun exists). Each rank loads the plugin the
 * way a host does, then checks: all_gather == concatenation, reduce_scatter
 * and all_reduce against a reference and bit-identical to the local
 * backend run in-process on the same inputs, broadcast from every root,
 * exact statistics, lpx_comm_run("mpi"), and the failure model (abort,
 * stall past the timeout, a rank that leaves, a bad argument): every other
 * rank gets an error within the timeout, never a hang.
 *
 * Environment (set by tests/meson.build): LPX_TEST_MPI_PLUGIN, the path of
 * lpx-mpi.so; LPX_TEST_MPIRUN, the mpirun to use. */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "comm_util.h"
#include "backends/mpi/lpx_mpi.h"

#define MAXR 16
#define FAULT_TIMEOUT_MS 300

static lpx_mpi_comm_create_fn comm_create;
static lpx_mpi_finalize_fn mpi_finalize;
static int rank_, size_;

/* ---- launcher ------------------------------------------------------ */

static bool is_open_mpi(const char *mpirun)
{
    char cmd[1200], line[256];
    snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", mpirun);
    FILE *p = popen(cmd, "r");
    bool yes = false;
    while (p && fgets(line, sizeof line, p))
        if (strstr(line, "Open MPI") || strstr(line, "OpenRTE")) yes = true;
    if (p) pclose(p);
    return yes;
}

static int launch(const char *self, const char *np)
{
    const char *plugin = getenv("LPX_TEST_MPI_PLUGIN");
    if (!plugin || !*plugin || access(plugin, R_OK)) {
        printf("skip: lpx-mpi.so was not built (MPI not found when configuring)\n");
        return 77;
    }
    const char *mpirun = getenv("LPX_TEST_MPIRUN");
    if (!mpirun || !*mpirun || access(mpirun, X_OK)) {
        printf("skip: no mpirun\n");
        return 77;
    }
    const char *argv[16];
    int n = 0;
    argv[n++] = mpirun;
    if (is_open_mpi(mpirun)) {
        /* containers run as root; 4 ranks on 2 cores needs oversubscription */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        argv[n++] = "--allow-run-as-root";
        argv[n++] = "--oversubscribe";
        argv[n++] = "--bind-to";
        argv[n++] = "none";
        argv[n++] = "--timeout";  /* a last resort: the test itself never hangs */
        argv[n++] = "200";
    }
    argv[n++] = "-np";
    argv[n++] = np;
    argv[n++] = self;
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execv(mpirun, (char *const *)argv);
        perror("execv mpirun");
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* ---- helpers ------------------------------------------------------- */

static lpx_comm *world(int64_t timeout_ms)
{
    lpx_comm *c = NULL;
    lpx_status st = comm_create(NULL, &c);
    if (st) {
        fprintf(stderr, "rank %d: lpx_mpi_comm_create: %s\n", rank_, lpx_last_error());
        exit(1);
    }
    if (timeout_ms) lpx_comm_set_timeout(c, timeout_ms);
    return c;
}

/* Inputs of rank q for a case: the same on every process. */
static void inputs(void *dst, int q, uint64_t case_seed, lpx_dtype d, size_t n)
{
    seed(case_seed * 131 + (uint64_t)q);
    fill_random(dst, d, n);
}

/* ---- properties ---------------------------------------------------- */

static void test_plugin_registers_backend(void)
{
    const lpx_comm_backend_i *b = NULL;
    CHECK_OK(lpx_comm_backend_find("mpi", &b));
    CHECK(b && strstr(b->description, "MPI"));
}

static void test_all_gather_is_concatenation(void)
{
    lpx_comm *c = world(0);
    CHECK(lpx_comm_size(c) == size_ && lpx_comm_rank(c) == rank_);
    CHECK(strcmp(lpx_comm_backend_name(c), "mpi") == 0);
    static const size_t sizes[] = {0, 1, 7, 1000, 70001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int inplace = 0; inplace < 2; inplace++) {
            size_t nb = sizes[s];
            unsigned char *recv = malloc(nb * (size_t)size_ + 1), *want = malloc(nb * (size_t)size_ + 1);
            for (int q = 0; q < size_; q++) inputs(want + (size_t)q * nb, q, 10 + s, LPX_U8, nb);
            unsigned char *send = inplace ? recv + (size_t)rank_ * nb : malloc(nb + 1);
            memcpy(send, want + (size_t)rank_ * nb, nb);
            CHECK_OK(lpx_comm_all_gather_buf(c, send, recv, nb));
            CHECKF(!memcmp(recv, want, nb * (size_t)size_), "nbytes=%zu inplace=%d", nb, inplace);
            if (!inplace) free(send);
            free(recv);
            free(want);
        }
    lpx_comm_destroy(c);
}

/* The local backend on the same inputs, for the bit-identity check. */
typedef struct localref {
    lpx_coll kind;
    void *send[MAXR], *recv[MAXR];
    size_t count;
    lpx_dtype d;
    lpx_reduce_op op;
} localref;

static lpx_status localref_rank(lpx_comm *c, void *ctx)
{
    localref *l = ctx;
    int r = lpx_comm_rank(c);
    return l->kind == LPX_COLL_ALL_REDUCE
               ? lpx_comm_all_reduce_buf(c, l->send[r], l->recv[r], l->count, l->d, l->op)
               : lpx_comm_reduce_scatter_buf(c, l->send[r], l->recv[r], l->count, l->d, l->op);
}

static void test_reductions_match_local_backend(void)
{
    lpx_comm *c = world(0);
    static const size_t counts[] = {0, 1, 3, 1031};
    /* fp8 too: 1 byte per element over MPI, the same bits as local */
    static const lpx_dtype dts[] = {LPX_F32, LPX_BF16, LPX_F16, LPX_F8E4M3FN, LPX_F8E5M2};
    static const lpx_reduce_op ops[] = {LPX_REDUCE_SUM, LPX_REDUCE_AVG, LPX_REDUCE_MAX, LPX_REDUCE_MIN};
    uint64_t cs = 100;
    for (size_t ci = 0; ci < 4; ci++)
        for (int di = 0; di < (int)(sizeof dts / sizeof *dts); di++)
            for (int oi = 0; oi < 4; oi++)
                for (int kind = 0; kind < 2; kind++, cs++) {
                    lpx_coll k = kind ? LPX_COLL_ALL_REDUCE : LPX_COLL_REDUCE_SCATTER;
                    size_t cnt = counts[ci], es = lpx_dtype_nbytes(dts[di], 1);
                    size_t in_n = k == LPX_COLL_ALL_REDUCE ? cnt : cnt * (size_t)size_;
                    localref l = {.kind = k, .count = cnt, .d = dts[di], .op = ops[oi]};
                    for (int q = 0; q < size_; q++) {
                        l.send[q] = malloc(in_n * es + 1);
                        l.recv[q] = malloc(cnt * es + 1);
                        inputs(l.send[q], q, cs, l.d, in_n);
                    }
                    unsigned char *mine = malloc(cnt * es + 1);
                    lpx_status st = k == LPX_COLL_ALL_REDUCE
                                        ? lpx_comm_all_reduce_buf(c, l.send[rank_], mine, cnt, l.d, l.op)
                                        : lpx_comm_reduce_scatter_buf(c, l.send[rank_], mine, cnt, l.d, l.op);
                    CHECK_OK(st);
                    CHECK_OK(lpx_local_run(size_, localref_rank, &l, 10000, NULL));
                    CHECKF(!memcmp(mine, l.recv[rank_], cnt * es), "%s count=%zu %s %s differs from local",
                           lpx_coll_name(k), cnt, lpx_dtype_name(l.d), lpx_reduce_op_name(l.op));
                    /* and against plain arithmetic for f32 sums of rank order */
                    if (l.d == LPX_F32 && l.op == LPX_REDUCE_SUM && cnt) {
                        size_t base = k == LPX_COLL_ALL_REDUCE ? 0 : (size_t)rank_ * cnt;
                        float acc = ((float *)l.send[0])[base];
                        for (int q = 1; q < size_; q++) acc += ((float *)l.send[q])[base];
                        float got;
                        memcpy(&got, mine, 4);
                        CHECK(got == acc);
                    }
                    for (int q = 0; q < size_; q++) {
                        free(l.send[q]);
                        free(l.recv[q]);
                    }
                    free(mine);
                }
    lpx_comm_destroy(c);
}

static void test_broadcast_from_every_root(void)
{
    lpx_comm *c = world(0);
    for (int root = 0; root < size_; root++) {
        unsigned char buf[333], want[333];
        inputs(buf, rank_, 500 + (uint64_t)root, LPX_U8, sizeof buf);
        inputs(want, root, 500 + (uint64_t)root, LPX_U8, sizeof want);
        CHECK_OK(lpx_comm_broadcast_buf(c, buf, sizeof buf, root));
        CHECKF(!memcmp(buf, want, sizeof buf), "root %d", root);
    }
    lpx_comm_destroy(c);
}

static void test_statistics_exact(void)
{
    lpx_comm *c = world(0);
    unsigned char s[8] = {0}, r[8 * MAXR];
    float f[4] = {1, 2, 3, 4};
    CHECK_OK(lpx_comm_all_gather_buf(c, s, r, 8));
    CHECK_OK(lpx_comm_all_reduce_buf(c, f, f, 4, LPX_F32, LPX_REDUCE_MAX));
    CHECK_OK(lpx_comm_all_reduce_buf(c, f, f, 4, LPX_F32, LPX_REDUCE_MAX));
    CHECK_OK(lpx_comm_barrier(c));
    lpx_comm_stats st = {.struct_size = sizeof st};
    CHECK_OK(lpx_comm_stats_get(c, &st));
    CHECK(st.calls[LPX_COLL_ALL_GATHER] == 1 && st.bytes[LPX_COLL_ALL_GATHER] == 8);
    CHECK(st.calls[LPX_COLL_ALL_REDUCE] == 2 && st.bytes[LPX_COLL_ALL_REDUCE] == 32);
    CHECK(st.calls[LPX_COLL_BARRIER] == 1 && st.calls[LPX_COLL_REDUCE_SCATTER] == 0);
    CHECK(f[0] == 1 && f[3] == 4);
    lpx_comm_destroy(c);
}

static lpx_status run_rank(lpx_comm *c, void *ctx)
{
    int *seen = ctx;
    *seen = lpx_comm_size(c);
    return lpx_comm_barrier(c);
}

static void test_comm_run_mpi(void)
{
    int seen = 0;
    lpx_status st[MAXR];
    CHECK_OK(lpx_comm_run("mpi", 0, 5000, run_rank, &seen, NULL));
    CHECK(seen == size_);
    CHECK_OK(lpx_comm_run("mpi", size_, 5000, run_rank, &seen, st));
    CHECK(st[rank_] == LPX_OK);
    CHECK_ERR(lpx_comm_run("mpi", size_ + 1, 5000, run_rank, &seen, NULL), LPX_EINVAL);
}

/* ---- failure model ------------------------------------------------- */

/* The call every rank but the culprit makes after the fault. */
static void expect_failure(lpx_comm *c, const char *who, double limit_ms)
{
    unsigned char s[4] = {0}, r[4 * MAXR];
    uint64_t t0 = lpx_now_ns();
    lpx_status st = lpx_comm_all_gather_buf(c, s, r, 4);
    double ms = ms_since(t0);
    CHECKF(st == LPX_ECOMM || st == LPX_ETIMEOUT, "rank %d: %s", rank_, lpx_status_string(st));
    CHECKF(strstr(lpx_last_error(), "all_gather #") && strstr(lpx_last_error(), who), "rank %d: '%s'", rank_,
           lpx_last_error());
    CHECKF(ms < limit_ms, "rank %d: took %.1f ms (limit %.1f)", rank_, ms, limit_ms);
    CHECK_ERR(lpx_comm_barrier(c), LPX_ECOMM);
    CHECK(strstr(lpx_last_error(), "failed earlier") != NULL);
}

static void test_abort_fails_everyone(void)
{
    lpx_comm *c = world(FAULT_TIMEOUT_MS);
    float v[8] = {0};
    CHECK_OK(lpx_comm_all_reduce_buf(c, v, v, 8, LPX_F32, LPX_REDUCE_SUM));
    int culprit = size_ - 1;
    if (rank_ == culprit) {
        lpx_comm_abort(c, "injected failure");
        CHECK_ERR(lpx_comm_barrier(c), LPX_ECOMM);
    } else {
        char who[64];
        snprintf(who, sizeof who, "rank %d aborted: injected failure", culprit);
        expect_failure(c, who, FAULT_TIMEOUT_MS);  /* told, not timed out */
    }
    lpx_comm_destroy(c);
}

static void test_stall_times_out_everyone(void)
{
    lpx_comm *c = world(FAULT_TIMEOUT_MS);
    CHECK_OK(lpx_comm_barrier(c));
    if (rank_ == 1) {
        sleep_ms(2 * FAULT_TIMEOUT_MS);
        unsigned char s[4] = {0}, r[4 * MAXR];
        uint64_t t0 = lpx_now_ns();
        CHECK_ERR(lpx_comm_all_gather_buf(c, s, r, 4), LPX_ECOMM);  /* a notice was waiting */
        CHECKF(strstr(lpx_last_error(), "timed out after"), "'%s'", lpx_last_error());
        CHECK(ms_since(t0) < FAULT_TIMEOUT_MS);
    } else {
        expect_failure(c, "timed out after", 2.0 * FAULT_TIMEOUT_MS);
    }
    lpx_comm_destroy(c);
}

static void test_leaving_rank_times_out_everyone(void)
{
    lpx_comm *c = world(FAULT_TIMEOUT_MS);
    CHECK_OK(lpx_comm_barrier(c));
    if (rank_ == 1) {
        lpx_comm_destroy(c);  /* leaves without joining the all_gather */
        return;
    }
    expect_failure(c, "timed out after", 2.0 * FAULT_TIMEOUT_MS);
    lpx_comm_destroy(c);
}

static void test_bad_argument_fails_everyone(void)
{
    lpx_comm *c = world(FAULT_TIMEOUT_MS);
    CHECK_OK(lpx_comm_barrier(c));
    if (rank_ == 0) {
        unsigned char r[4 * MAXR];
        CHECK_ERR(lpx_comm_all_gather_buf(c, NULL, r, 4), LPX_EINVAL);
        CHECK(strstr(lpx_last_error(), "all_gather #2 (rank 0 of") && strstr(lpx_last_error(), "send is NULL"));
    } else {
        expect_failure(c, "rank 0 aborted: bad argument to all_gather #2: send is NULL", FAULT_TIMEOUT_MS);
    }
    lpx_comm_destroy(c);
}

static int child(void)
{
    const char *path = getenv("LPX_TEST_MPI_PLUGIN");
    const lpx_plugin *p = NULL;
    if (lpx_plugin_load(path, &p)) {
        fprintf(stderr, "lpx_plugin_load(%s): %s\n", path, lpx_last_error());
        return 1;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    comm_create = h ? (lpx_mpi_comm_create_fn)(uintptr_t)dlsym(h, "lpx_mpi_comm_create") : NULL;
    mpi_finalize = h ? (lpx_mpi_finalize_fn)(uintptr_t)dlsym(h, "lpx_mpi_finalize") : NULL;
    if (!comm_create || !mpi_finalize) {
        fprintf(stderr, "lpx-mpi.so lacks its entry points: %s\n", dlerror());
        return 1;
    }
    lpx_comm *c = world(0);
    rank_ = lpx_comm_rank(c);
    size_ = lpx_comm_size(c);
    lpx_comm_destroy(c);
    if (size_ > MAXR) {
        fprintf(stderr, "at most %d ranks\n", MAXR);
        return 1;
    }
    if (rank_ != 0 && !freopen("/dev/null", "w", stdout)) return 1;  /* one report; errors still show */
    printf("mpi world of %d ranks\n", size_);
    RUN(test_plugin_registers_backend);
    RUN(test_all_gather_is_concatenation);
    RUN(test_reductions_match_local_backend);
    RUN(test_broadcast_from_every_root);
    RUN(test_statistics_exact);
    RUN(test_comm_run_mpi);
    RUN(test_abort_fails_everyone);
    RUN(test_stall_times_out_everyone);
    RUN(test_leaving_rank_times_out_everyone);
    RUN(test_bad_argument_fails_everyone);
    mpi_finalize();
    return CHECK_DONE();
}

/* `test_comm_mpi stall`: rank 1 stops itself (SIGSTOP) after a barrier;
 * rank 0 times out and exits without finalizing. Before, its exit handler
 * called MPI_Finalize, which waits for every process: the job hung until
 * mpirun's own timeout. Now the handler ends the job with MPI_Abort, so
 * mpirun exits non-zero within the comm timeout plus start-up. */
#define STALL_TIMEOUT_MS 1500

static int stall_child(void)
{
    const char *path = getenv("LPX_TEST_MPI_PLUGIN");
    if (lpx_plugin_load(path, NULL)) return 1;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    comm_create = h ? (lpx_mpi_comm_create_fn)(uintptr_t)dlsym(h, "lpx_mpi_comm_create") : NULL;
    if (!comm_create) return 1;
    lpx_comm *c = world(STALL_TIMEOUT_MS);
    if (!c || lpx_comm_barrier(c)) return 1;
    if (lpx_comm_rank(c) == 1) raise(SIGSTOP);   /* a stalled peer: alive, silent */
    unsigned char s[4] = {0}, r[4 * MAXR];
    lpx_status st = lpx_comm_all_gather_buf(c, s, r, 4);
    fprintf(stderr, "rank %d: %s (%s)\n", lpx_comm_rank(c), lpx_status_string(st), lpx_last_error());
    return 1;   /* exit after a failed comm, without lpx_mpi_finalize */
}

static const char *self_path;

static void test_stalled_rank_ends_the_job(void)
{
    const char *self = self_path;
    setenv("LPX_TEST_MPI_STALL", "1", 1);
    uint64_t t0 = lpx_now_ns();
    int rc = launch(self, "2");
    double s = ms_since(t0) / 1000.0;
    unsetenv("LPX_TEST_MPI_STALL");
    if (rc == 77) return;
    printf("  stalled rank: mpirun exited %d after %.1f s (comm timeout %.1f s)\n", rc, s, STALL_TIMEOUT_MS / 1000.0);
    CHECKF(rc != 0, "the job with a stalled rank exited 0");
    CHECKF(s < STALL_TIMEOUT_MS / 1000.0 + 15.0, "the job took %.1f s to end (timeout %.1f s)", s,
           STALL_TIMEOUT_MS / 1000.0);
}

int main(int argc, char **argv)
{
    /* under mpirun the launcher's environment names our rank */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK"))
        return getenv("LPX_TEST_MPI_STALL") ? stall_child() : child();
    if (argc > 1 && !strcmp(argv[1], "stall")) {
        if (!getenv("LPX_TEST_MPI_PLUGIN") || !*getenv("LPX_TEST_MPI_PLUGIN") || !getenv("LPX_TEST_MPIRUN") ||
            !*getenv("LPX_TEST_MPIRUN")) {
            printf("skip: no lpx-mpi.so or no mpirun\n");
            return 77;
        }
        self_path = argv[0];
        RUN(test_stalled_rank_ends_the_job);
        return CHECK_DONE();
    }
    return launch(argv[0], argc > 1 ? argv[1] : "2");
}
