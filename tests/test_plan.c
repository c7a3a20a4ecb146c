/* `lpx plan`'s cost model (tools/plan/), its pieces against cases worked
 * by hand: collective times from bytes, bandwidth and latency (ring
 * inside a node and across nodes, the tree for a small all-reduce), and
 * FSDP2's overlap: a step whose collectives hide behind compute, one whose
 * compute waits on every all-gather, and NCCL's SM share slowing compute. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include "check.h"
#include "tools/plan/plan.h"

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

static void test_ring_and_tree(void)
{
    pl_net net = {.intra_bw = 100e9, .inter_bw = 50e9, .latency = 5e-6, .gpus_per_node = 8};
    /* 1 GB all-gathered over 8 GPUs of one node: 7/8 of it crosses each
     * link at 100 GB/s, plus 7 hops: 8.75 ms + 35 us */
    double t = pl_coll_time(PL_ALL_GATHER, 1e9, 8, &net);
    CHECKF(near(t, 8.75e-3 + 35e-6), "all-gather 1 GB / 8 in a node: %.9g s", t);
    CHECK(near(pl_coll_time(PL_REDUCE_SCATTER, 1e9, 8, &net), t));
    /* over 16 GPUs of 2 nodes the ring crosses the NICs: 15/16 at 50 GB/s + 15 hops */
    t = pl_coll_time(PL_ALL_GATHER, 1e9, 16, &net);
    CHECKF(near(t, 18.75e-3 + 75e-6), "all-gather 1 GB / 16 over 2 nodes: %.9g s", t);
    /* an all-reduce moves twice the bytes and twice the hops */
    t = pl_coll_time(PL_ALL_REDUCE, 1e9, 8, &net);
    CHECKF(near(t, 2 * 8.75e-3 + 70e-6), "all-reduce 1 GB / 8: %.9g s", t);
    /* one f32 amax over 128 GPUs: the tree, 2 log2(128) = 14 hops */
    t = pl_coll_time(PL_ALL_REDUCE, 4, 128, &net);
    CHECKF(near(t, 14 * 5e-6 + 2 * 4 / 50e9), "amax all-reduce over 128: %.9g s", t);
    CHECK(pl_coll_time(PL_ALL_GATHER, 1e9, 1, &net) == 0);
}

/* Two groups: forward 10, backward 20, every collective 1. The first
 * all-gather is exposed (nothing to hide it), every later one runs
 * beside a forward or backward, the last reduce-scatter is exposed (the
 * optimizer waits for it): step = 1 + 60 + 1. */
static void test_fully_overlapped(void)
{
    pl_group g[2] = {{10, 20, 1, 1, 1}, {10, 20, 1, 1, 1}};
    pl_sched_opts o = {0, 0, 0};
    pl_sched s;
    pl_schedule(g, 2, &o, &s);
    CHECKF(near(s.step, 62) && near(s.exposed_comm, 2) && near(s.compute, 60) && near(s.comm, 6) &&
           near(s.fwd_end, 21), "overlapped: step %g, exposed %g, compute %g, comm %g, forward ends %g", s.step,
           s.exposed_comm, s.compute, s.comm, s.fwd_end);
    /* the optimizer and one combined amax all-reduce after it */
    o.tail = 5;
    o.tail_comm = 0.25;
    pl_schedule(g, 2, &o, &s);
    CHECKF(near(s.step, 67.25) && near(s.exposed_comm, 2.25), "with the tail: step %g, exposed %g", s.step,
           s.exposed_comm);
}

/* Collectives ten times longer than compute: the comm stream sets the
 * pace. Forward: AG0 [0,10], F0 [10,11], AG1 [10,20], F1 [20,21]; AG_b1
 * (issued at F1's start) [20,30], B1 [30,32]; AG_b0 (issued at B1's
 * start) [30,40], RS1 [40,50], B0 [40,42], RS0 [50,60]: step 60, compute
 * 6, the rest exposed. */
static void test_fully_exposed(void)
{
    pl_group g[2] = {{1, 2, 10, 10, 10}, {1, 2, 10, 10, 10}};
    pl_sched_opts o = {0, 0, 0};
    pl_sched s;
    pl_schedule(g, 2, &o, &s);
    CHECKF(near(s.step, 60) && near(s.exposed_comm, 54) && near(s.fwd_end, 21),
           "exposed: step %g, exposed %g, forward ends %g", s.step, s.exposed_comm, s.fwd_end);
}

/* NCCL holding half the SMs: group 0's forward (10) runs beside group 1's
 * all-gather (4) for 4 s at half speed, so it ends 2 s late (contention
 * 2); nothing else overlaps, so the step is 2 s longer than at share 0. */
static void test_sm_share(void)
{
    pl_group g[2] = {{10, 0, 0, 0, 0}, {10, 0, 4, 0, 0}};
    pl_sched_opts o = {0.5, 0, 0};
    pl_sched s, s0;
    pl_schedule(g, 2, &o, &s);
    o.sm_share = 0;
    pl_schedule(g, 2, &o, &s0);
    CHECKF(near(s.contention, 2) && near(s.fwd_end, 22) && near(s0.fwd_end, 20) && near(s.step - s0.step, 2),
           "sm share: contention %g, forward ends %g (%g without), step %g vs %g", s.contention, s.fwd_end, s0.fwd_end,
           s.step, s0.step);
}

/* runs `lpx ARGS`, its stdout and stderr into out; the exit code */
static int run(const char *args, char *out, size_t n)
{
    const char *exe = getenv("LPX_TEST_LPX_EXE");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    size_t k = p ? fread(out, 1, n - 1, p) : 0;
    out[k] = 0;
    int st = p ? pclose(p) : -1;
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The command: its JSON has the five steps with bf16 first at 1.00x and
 * the float8 ones faster on a compute-bound case; its table names the
 * chip file; bad options are refused with one line, exit 2. */
static void test_cli(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    static char out[65536];
    int rc = run("plan --model llama3-8b --gpus 8 --batch 2 --seq 4096 --json", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "\"case\": \"bf16\"") && strstr(out, "\"speedup\": 1.0000") &&
           strstr(out, "float8-tensorwise as lpx runs it") && strstr(out, "\"memory_per_gpu_bytes\""), "json: %d %s",
           rc, out);
    const char *last = strrchr(out, '{');
    double sp = 0;
    const char *k = last ? strstr(last, "\"speedup\": ") : NULL;
    if (k) sp = strtod(k + 11, NULL);
    CHECKF(sp > 1.05 && sp < 2.0, "float8 speedup on a compute-bound 8B step: %g", sp);
    rc = run("plan --model llama3-70b --gpus 128 --batch 4 --explain", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "h100.json") && strstr(out, "ring: (N-1)/N bytes") && strstr(out, "one block"),
           "table: %d %s", rc, out);
    static const char *const refused[][2] = {
        {"plan --gpus 0", "expected a positive integer for --gpus"},
        {"plan --net intra=x", "--net: a positive number for intra"},
        {"plan --chip nosuch", "cannot open it"},
        {"plan --recipe nf4-qlora", "--recipe: bf16, float8-tensorwise or float8-rowwise"},
        {"plan --frobnicate", "unknown option"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        rc = run(refused[i][0], out, sizeof out);
        CHECKF(rc == 2 && strstr(out, refused[i][1]), "%s: %d %s", refused[i][0], rc, out);
    }
}

/* The chip file the GPU benchmark leaves (scripts/chip-file.py over its
 * JSON lines): lpx plan reads it, names it, and its measured rates (below
 * the peaks) give a slower step than the published file; a benchmark run
 * missing a case writes no file. */
static void test_chip_file_from_benchmark(void)
{
    const char *py = getenv("LPX_TEST_PYTHON"), *script = getenv("LPX_TEST_CHIP_SCRIPT");
    if (!getenv("LPX_TEST_LPX_EXE") || !py || !script) SKIP_CASE("LPX_TEST_PYTHON / LPX_TEST_CHIP_SCRIPT not set");
    char dir[] = "/tmp/lpx-plan-XXXXXX", path[128], cmd[2048];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/lpx.jsonl", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"impl\": \"lpx\", \"case\": \"copy\", \"desc\": \"copy\", \"gbps\": 3010.5, \"error\": null}\n"
          "{\"impl\": \"lpx\", \"case\": \"gemm_bf16\", \"desc\": \"8192^3\", \"tflops\": 702.3, \"error\": null}\n"
          "{\"impl\": \"torch\", \"case\": \"gemm_bf16\", \"tflops\": 1.0}\n",
          f);
    fclose(f);
    static char out[65536];
    /* no fp8 GEMM row: refused */
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' --name X --sms 132 --memory-gib 80 --peak-tflops 989.4 > '%s/chip.json' 2>&1",
             py, script, path, dir);
    CHECKF(system(cmd) != 0, "a run without gemm_fp8_tensorwise gave a chip file");
    f = fopen(path, "a");
    if (f) {
        fputs("{\"impl\": \"lpx\", \"case\": \"gemm_fp8_tensorwise\", \"desc\": \"8192^3\", \"tflops\": 1180.0, "
              "\"error\": null}\n", f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' --name 'NVIDIA H100' --sms 132 --memory-gib 80 --peak-tflops 989.4 > "
             "'%s/chip.json'", py, script, path, dir);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "plan --model llama3-8b --batch 2 --chip '%s/chip.json' --json", dir);
    int rc = run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "NVIDIA H100 (measured)"), "plan with the measured file: %d %s", rc, out);
    const char *k = strstr(out, "\"step_s\": ");
    double measured = k ? strtod(k + 10, NULL) : 0;
    rc = run("plan --model llama3-8b --batch 2 --json", out, sizeof out);
    k = strstr(out, "\"step_s\": ");
    double peaks = k ? strtod(k + 10, NULL) : 0;
    /* bf16 step: 702.3 of 989.4 TFLOP/s and 3.0 of 3.35 TB/s: slower */
    CHECKF(rc == 0 && peaks > 0 && measured > 1.2 * peaks && measured < 1.5 * peaks,
           "bf16 step: %g s measured, %g s with the peaks", measured, peaks);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    RUN(test_ring_and_tree);
    RUN(test_fully_overlapped);
    RUN(test_fully_exposed);
    RUN(test_sm_share);
    RUN(test_cli);
    RUN(test_chip_file_from_benchmark);
    return CHECK_DONE();
}
