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
#include "tools/plan/optim_mem.h"
#include "tools/train/mem.h"
#include "lpx/dtensor.h"
#include "lpx/optim_state.h"

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
        {"plan --gpus 0", "--gpus '0': expected an integer in 1..1048576"},
        {"plan --net intra=x", "--net intra=x: expected GB/s in 0.001..100000"},
        {"plan --chip nosuch", "cannot open it"},
        {"plan --recipe nf4-qlora", "--recipe: bf16, float8-tensorwise or float8-rowwise"},
        {"plan --frobnicate", "unknown option"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        rc = run(refused[i][0], out, sizeof out);
        CHECKF(rc == 2 && strstr(out, refused[i][1]), "%s: %d %s", refused[i][0], rc, out);
    }
}

/* lpx plan's sizes on a grouped-query model, worked by hand:
 *   --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 512 --vocab 1024,
 *   2 GPUs, batch 1 x seq 128, bf16, --ac none
 * D 256, head dim 32, KV = 2 x 32 = 64, F 512, V 1024, T = 128 tokens.
 * A block's linear weights W = 2 D^2 (q, o) + 2 D KV (k, v) + 3 D F
 *   = 131072 + 32768 + 393216 = 557056; P = W + 2 D (norms) = 557568.
 * params: 2 blocks x 557568 + embedding 262144 + head 262144 + norm 256
 *   = 1639680 (with kv 8, MHA: 1836288).
 * per block: GEMMs 6 T W = 427819008 FLOP (0.000428 TFLOP); all-gather
 *   2 P = 1115136 B (bf16: 0.00112 GB); reduce-scatter 4 P = 2230272 B
 *   (f32: 0.00223 GB).
 * memory per GPU (lpx mem's model, 2 ranks, every row count even):
 *   params 4 x 1639680 / 2 = 3279360; AdamW 2 x that = 6558720;
 *   grads: shards 3279360 + the largest group's full f32 grads (a block,
 *   4 x 557568 = 2230272) = 5509632; unsharded: two adjacent blocks in
 *   bf16, 2 x 2 x 557568 = 2230272; activations (bf16, bt = 128): per
 *   block 2 x 128 x (6 D + 2 KV + 3 F = 3200) + 4 x (2 x 128 + 8 heads x
 *   128) = 824320, x 2 blocks + the head's 2 x 3 x 128 x D + 4 x 128 =
 *   197120: 1845760; the loss chunk (128 rows): logits and their grad
 *   2 x 128 x V x 2 = 524288 + the head's grad in bf16 and f32, V D x 6
 *   = 1572864: 2097152. Total 21520896 bytes. */
static void test_cli_gqa_numbers(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    static char out[65536];
    const char *m = "plan --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 512 --vocab 1024 --gpus 2 --seq 128 "
                    "--ac none --recipe bf16";
    char args[512];
    snprintf(args, sizeof args, "%s --json", m);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "\"kv_heads\": 2") && strstr(out, "\"params\": 1639680"), "json: %d %s", rc, out);
    const char *k = strstr(out, "\"memory_per_gpu_bytes\": ");
    double mem = k ? strtod(k + strlen("\"memory_per_gpu_bytes\": "), NULL) : -1;
    CHECKF(mem == 21520896.0, "memory per GPU %.0f bytes, worked by hand 21520896", mem);
    rc = run(m, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "1639680 params") && strstr(out, "(0.000428 TFLOP)") &&
           strstr(out, "x2 (0.00112 GB each)") && strstr(out, "reduce-scatter") && strstr(out, "(0.00223 GB)"),
           "table: %d %s", rc, out);
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


/* A NaN or infinite time is refused before the simulation starts: the
 * event loop would never reach its end on one (issue 33: a denormal
 * bandwidth made every collective inf, then NaN, and lpx plan spun). */
static void test_schedule_refuses_nonfinite(void)
{
    pl_group g[2] = {{10, 20, 1, 1, 1}, {10, 20, INFINITY, 1, 1}};
    pl_sched_opts o = {0, 0, 0};
    pl_sched s;
    CHECK(pl_schedule(g, 2, &o, &s) == LPX_ERANGE);
    CHECKF(strstr(lpx_last_error(), "group 1") != NULL, "%s", lpx_last_error());
    g[1].ag_fwd = NAN;
    CHECK(pl_schedule(g, 2, &o, &s) == LPX_ERANGE);
    g[1].ag_fwd = 1;
    o.tail = -1;
    CHECK(pl_schedule(g, 2, &o, &s) == LPX_ERANGE);
    o.tail = 0;
    CHECK(pl_schedule(g, 2, &o, &s) == LPX_OK && near(s.step, 62));
}

/* Every rate and size option of lpx plan and lpx mem has a sane range,
 * refused in one line naming the option (exit 2): a denormal network rate
 * (which spun forever), NaN, out-of-range sizes, a seq x batch whose
 * memory estimate would overflow int64 (printed as a negative memory per
 * GPU before), more NCCL CTAs than the chip has SMs. */
static void test_ranges(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    static char out[65536];
    static const char *const refused[][2] = {
        {"plan --net intra=4e-320", "lpx plan: --net intra=4e-320: expected GB/s in 0.001..100000"},
        {"plan --net inter=1e6", "lpx plan: --net inter=1e6: expected GB/s in 0.001..100000"},
        {"plan --net latency=nan", "lpx plan: --net latency=nan: expected us in 0.001..1e+06"},
        {"plan --net latency=inf", "lpx plan: --net latency=inf: expected us in 0.001..1e+06"},
        {"plan --net intra=", "lpx plan: --net intra=: expected GB/s"},
        {"plan --seq 16777217", "lpx plan: --seq '16777217': expected an integer in 1..16777216"},
        {"plan --batch 1048577", "lpx plan: --batch '1048577': expected an integer in 1..1048576"},
        {"plan --gpus 99999999999999999999", "lpx plan: --gpus '99999999999999999999': expected an integer"},
        {"plan --gpus-per-node 1025", "lpx plan: --gpus-per-node '1025': expected an integer in 1..1024"},
        {"plan --max-ctas 133", "lpx plan: --max-ctas 133: more than the chip's 132 SMs"},
        {"plan --seq 16777216 --batch 1048576",
         "lpx plan: the memory estimate overflows (about 7.89e+19 bytes per rank: seq 16777216 x batch 1048576"},
        {"mem --model llama3-405b --seq 16777216 --batch 1048576",
         "lpx mem: the memory estimate overflows (about 1.16e+21 bytes per rank"},
        {"mem --seq 16777217", "lpx mem: --seq '16777217': expected an integer in 1..16777216"},
        {"mem --lora-rank 65537", "lpx mem: --lora-rank '65537': expected an integer in 1..65536"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        int rc = run(refused[i][0], out, sizeof out);
        const char *nl = strchr(out, '\n');
        CHECKF(rc == 2 && strstr(out, refused[i][1]) && nl && !nl[1], "%s: exit %d, want one line '%s': %s",
               refused[i][0], rc, refused[i][1], out);
    }
    /* the largest accepted sizes still give a finite plan */
    int rc = run("plan --seq 16777216 --batch 1 --gpus 1048576 --gpus-per-node 1024 --max-ctas 132 --json", out,
                 sizeof out);
    CHECKF(rc == 0 && strstr(out, "\"memory_per_gpu_bytes\": ") && !strstr(out, "nan") && !strstr(out, "inf"),
           "largest sizes: %d %s", rc, out);
}

/* The memory estimate is linear in the layers (it summed every group's
 * wire bytes over every parameter: 30000 layers took a minute, the
 * allowed 100000 about eleven): 100000 layers answer in seconds, and its
 * numbers for 30000 are what the per-group sums gave. */
static void test_many_layers(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    static char out[65536];
    int rc = run("plan --layers 30000 --json", out, sizeof out);
    /* 15106733654016 before the loss chunk was counted, + its 5286199296 bytes (4160 rows of llama3-8b's
     * 128256 logits and their grad in bf16, 2 x 4160 x 128256 x 2, + the head's grad, 128256 x 4096 x 6) */
    CHECKF(rc == 0 && strstr(out, "\"memory_per_gpu_bytes\": 15112019853312,"), "30000 layers: %d %s", rc, out);
    /* `timeout 20 lpx ...`: run() puts the executable first */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "--version >/dev/null; timeout 20 '%s' plan --layers 100000 --json",
             getenv("LPX_TEST_LPX_EXE"));
    rc = run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "\"layers\": 100000"), "plan, 100000 layers within 20 s: %d %.300s", rc, out);
    snprintf(cmd, sizeof cmd, "--version >/dev/null; timeout 20 '%s' mem --model llama3-8b --layers 100000 --ranks 8",
             getenv("LPX_TEST_LPX_EXE"));
    rc = run(cmd, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "layers 100000"), "mem, 100000 layers within 20 s: %d %.300s", rc, out);
}

/* writes a chip file into dir with bf16/peak/fp8/extra fields; its path */
static void chip_file(const char *dir, const char *name, const char *fields, char *path, size_t n)
{
    snprintf(path, n, "%s/%s.json", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "{\"name\": \"%s\", %s}\n", name, fields);
    fclose(f);
}

#define NUM(k, v) "\"" k "\": {\"value\": " v ", \"source\": \"test\"}"
#define GOOD_REST NUM("memory_gib", "80") ", " NUM("copy_gbs", "3350")

/* A chip file whose achieved rate is above its peak (the MFU was printed
 * as 82,521,568%), or with a non-finite, non-positive or fractional
 * number, is refused naming the file and the field; with published peaks
 * no MFU is over 100% (fp8 GEMMs count against the fp8 peak: a
 * compute-bound 405B step printed 169.5% before). */
static void test_chip_checks_and_mfu(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    char dir[] = "/tmp/lpx-plan-chip-XXXXXX", path[256], cmd[512];
    CHECK(mkdtemp(dir) != NULL);
    static char out[65536];
    static const char *const bad[][3] = {
        {"over", NUM("sms", "132") ", " NUM("bf16_tflops", "989") ", " NUM("fp8_tflops", "1000") ", "
         NUM("bf16_peak_tflops", "0.0012") ", " GOOD_REST, "\"bf16_tflops\" 989 exceeds \"bf16_peak_tflops\" 0.0012"},
        {"fp8over", NUM("sms", "132") ", " NUM("bf16_tflops", "900") ", " NUM("fp8_tflops", "2000") ", "
         NUM("bf16_peak_tflops", "989.4") ", " GOOD_REST, "\"fp8_tflops\" 2000 exceeds the fp8 peak 1978.8"},
        {"attnover", NUM("sms", "132") ", " NUM("bf16_tflops", "900") ", " NUM("fp8_tflops", "1000") ", "
         NUM("attention_tflops", "990") ", " NUM("bf16_peak_tflops", "989.4") ", " GOOD_REST,
         "\"attention_tflops\" 990 exceeds \"bf16_peak_tflops\" 989.4"},
        {"inf", NUM("sms", "132") ", " NUM("bf16_tflops", "1e999") ", " NUM("fp8_tflops", "1000") ", "
         NUM("bf16_peak_tflops", "989.4") ", " GOOD_REST, "\"bf16_tflops\" inf: expected a number in 0.001..1e+06"},
        {"neg", NUM("sms", "132") ", " NUM("bf16_tflops", "900") ", " NUM("fp8_tflops", "1000") ", "
         NUM("bf16_peak_tflops", "989.4") ", " NUM("memory_gib", "80") ", " NUM("copy_gbs", "-3"),
         "\"copy_gbs\" -3: expected a number in 0.001..1e+07"},
        {"frac", NUM("sms", "132.5") ", " NUM("bf16_tflops", "900") ", " NUM("fp8_tflops", "1000") ", "
         NUM("bf16_peak_tflops", "989.4") ", " GOOD_REST, "\"sms\" 132.5: expected a whole number in 1..100000"},
        {"missing", NUM("sms", "132") ", " NUM("fp8_tflops", "1000") ", " NUM("bf16_peak_tflops", "989.4") ", "
         GOOD_REST, "\"bf16_tflops\" must be {\"value\": a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        chip_file(dir, bad[i][0], bad[i][1], path, sizeof path);
        snprintf(cmd, sizeof cmd, "plan --chip '%s'", path);
        int rc = run(cmd, out, sizeof out);
        const char *nl = strchr(out, '\n');
        CHECKF(rc == 2 && strstr(out, path) && strstr(out, bad[i][2]) && nl && !nl[1], "%s: exit %d, want '%s': %s",
               bad[i][0], rc, bad[i][2], out);
    }
    /* the rates at their peaks: accepted */
    chip_file(dir, "at", NUM("sms", "132") ", " NUM("bf16_tflops", "989.4") ", " NUM("fp8_tflops", "1978.8") ", "
              NUM("bf16_peak_tflops", "989.4") ", " GOOD_REST, path, sizeof path);
    snprintf(cmd, sizeof cmd, "plan --chip '%s' --json", path);
    CHECK(run(cmd, out, sizeof out) == 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    /* compute-bound: bf16 at 95.66% of the peak, the fp8 steps at 86.28%,
     * 86.91% of the peaks they run at (169.5% of the bf16 peak before) */
    int rc = run("plan --model llama3-405b --gpus 8 --batch 32 --seq 4096 --ac none --json", out, sizeof out);
    static const double want[5] = {0.9566, 0.8628, 0.8691, 0.8691, 0.8691};
    const char *k = out;
    for (int i = 0; i < 5; i++) {
        k = k ? strstr(k, "\"mfu\": ") : NULL;
        double m = k ? strtod(k + 7, NULL) : -1;
        CHECKF(rc == 0 && fabs(m - want[i]) < 1e-9, "step %d: MFU %g, want %g", i, m, want[i]);
        if (k) k += 7;
    }
}

/* a plan that does not fit says so first and gives no speed (the issue's
 * case: 687 GiB of 80 with a tokens/s and an MFU of 120% printed); --json
 * marks it; one that fits prints its steps */
static void test_no_speed_when_it_does_not_fit(void)
{
    static char out[1 << 16];
    int rc = run("plan --model llama3-70b --gpus 128 --batch 4 --ac none", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "DOES NOT FIT: ") && !strstr(out, "tok/s") && !strstr(out, "MFU"),
           "a plan that does not fit: %d %s", rc, out);
    rc = run("plan --model llama3-70b --gpus 128 --batch 4 --ac none --json", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "\"fits\": false"), "--json: %d %s", rc, out);
    rc = run("plan --model llama3-8b --gpus 8 --batch 1 --seq 4096 --ac full", out, sizeof out);
    CHECKF(rc == 0 && !strstr(out, "DOES NOT FIT") && strstr(out, "tok/s/GPU"), "a plan that fits: %d %s", rc, out);
    rc = run("plan --model llama3-8b --gpus 8 --batch 1 --seq 4096 --ac full --json", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "\"fits\": true"), "--json that fits: %d %s", rc, out);
}

/* The optimizer choices' bytes (tools/plan/optim_mem.c) against real state
 * tensors: on a small model of odd sizes (columns 1, 3, 5, 129, 200; rows
 * not a multiple of the world), every rank's shard of every parameter
 * (lpx_shard_range in the row unit optim_mem picks, blocks whole on each
 * rank: a shard starts on a block boundary of the global flat index) is
 * made into an m and a v state of that many elements with
 * lpx_optim_state_new, and lpx_optim_state_get_info's bytes summed: equal
 * to pl_optim_state_bytes per shard and to pl_optim_mem_geom per rank
 * (issue 37's "within 2% of the measured shards", here exact). */
static void test_optim_state_bytes_against_kinds(void)
{
    static const int64_t shapes[][2] = {{37, 129}, {300, 5}, {1000, 1}, {7, 3}, {513, 200}, {64, 256}, {1, 1}};
    enum { NP = sizeof shapes / sizeof *shapes };
    tr_param ps[NP];
    memset(ps, 0, sizeof ps);
    for (int i = 0; i < NP; i++) {
        ps[i].kind = i % 2 ? TR_P_LIN : TR_P_NORM;
        ps[i].rows = shapes[i][0];
        ps[i].cols = shapes[i][1];
    }
    tr_geom g;
    memset(&g, 0, sizeof g);
    g.nparams = NP;
    g.p = ps;
    static const lpx_optim_state_format fmt[] = {0, LPX_OPTIM_STATE_8BIT, LPX_OPTIM_STATE_4BIT, LPX_OPTIM_STATE_FP8};
    static const int worlds[] = {1, 2, 3, 5, 8};
    for (int o = 0; o < PL_OPTIMS; o++)
        for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
            int world = worlds[wi];
            int64_t total_elems = 0;
            for (int rank = 0; rank < world; rank++) {
                int64_t measured = 0, elems = 0, mblocks = 0;
                for (int i = 0; i < NP; i++) {
                    int64_t unit = pl_optim_row_unit((pl_optim)o, ps[i].cols, 1), chunk, start, len;
                    CHECK_OK(lpx_shard_range(ps[i].rows, world, rank, unit, &chunk, &start, &len));
                    int64_t n = len * ps[i].cols, block = pl_optim_block((pl_optim)o);
                    if (block && len > 0) CHECKF((start * ps[i].cols) % block == 0, "%s: shard at element %lld straddles a block",
                                      pl_optim_name((pl_optim)o), (long long)(start * ps[i].cols));
                    int64_t bytes = 0;
                    if (o == PL_OPTIM_ADAMW) bytes = 8 * n;
                    for (int role = 0; o != PL_OPTIM_ADAMW && role < 2 && n > 0; role++) {
                        lpx_tensor *t = NULL;
                        lpx_optim_state_info info;
                        CHECK_OK(lpx_optim_state_new(fmt[o], (lpx_optim_state_role)role, 1, &n, 0, lpx_cpu(), &t));
                        if (!t) continue;
                        CHECK_OK(lpx_optim_state_get_info(t, &info));
                        CHECK(info.numel == n && info.block == block);
                        bytes += info.bytes;
                        lpx_tensor_release(t);
                    }
                    CHECKF(bytes == pl_optim_state_bytes((pl_optim)o, n), "%s world %d rank %d param %d: kinds %lld, "
                           "counted %lld bytes", pl_optim_name((pl_optim)o), world, rank, i, (long long)bytes,
                           (long long)pl_optim_state_bytes((pl_optim)o, n));
                    measured += bytes;
                    elems += n;
                    if (block) mblocks += n / block + (n % block != 0);
                }
                /* a scaled f16 master on the same shards (low-precision
                 * moments: the state's block): 2 bytes + a scale per block */
                for (int m = PL_MASTER_F16S; o != PL_OPTIM_ADAMW && m < PL_MASTERS; m++) {
                    pl_optim_mem x;
                    CHECK(pl_optim_mem_geom(&g, TR_BF16, world, rank, 8, (pl_optim)o, (pl_master)m, &x) == 0);
                    CHECKF(x.state == measured && x.elems == elems && x.master == 2 * elems + 4 * mblocks,
                           "%s/%s world %d rank %d: master %lld, expected %lld", pl_optim_name((pl_optim)o),
                           pl_master_name((pl_master)m), world, rank, (long long)x.master,
                           (long long)(2 * elems + 4 * mblocks));
                }
                for (int m = 0; m < PL_MASTER_F16S; m++) {
                    pl_optim_mem x;
                    CHECK(pl_optim_mem_geom(&g, TR_BF16, world, rank, 8, (pl_optim)o, (pl_master)m, &x) == 0);
                    CHECKF(x.state == measured && x.elems == elems && x.grads == 4 * elems &&
                           x.master == (m ? 2 : 4) * elems, "%s/%s world %d rank %d: state %lld (kinds %lld), "
                           "elems %lld (%lld)", pl_optim_name((pl_optim)o), pl_master_name((pl_master)m), world, rank,
                           (long long)x.state, (long long)measured, (long long)x.elems, (long long)elems);
                }
                total_elems += elems;
            }
            int64_t all = 0;
            for (int i = 0; i < NP; i++) all += ps[i].rows * ps[i].cols;
            CHECKF(total_elems == all, "%s world %d: the shards hold %lld of %lld elements", pl_optim_name((pl_optim)o),
                   world, (long long)total_elems, (long long)all);
        }
    /* the row unit: whole blocks per rank, with blockwise float8's 128 rows */
    CHECK(pl_optim_row_unit(PL_OPTIM_8BIT, 4096, 1) == 1 && pl_optim_row_unit(PL_OPTIM_8BIT, 129, 1) == 256 &&
          pl_optim_row_unit(PL_OPTIM_4BIT, 200, 1) == 32 && pl_optim_row_unit(PL_OPTIM_FP8, 1, 128) == 256 &&
          pl_optim_row_unit(PL_OPTIM_ADAMW, 129, 128) == 128 && pl_optim_row_unit(PL_OPTIM_8BIT, 0, 1) == -1);
    /* sizes: a block's bytes, a short last block, overflow refused */
    CHECK(pl_optim_state_bytes(PL_OPTIM_8BIT, 256) == 2 * (256 + 4) && pl_optim_state_bytes(PL_OPTIM_4BIT, 257) ==
          2 * (128 + 1 + 8) && pl_optim_state_bytes(PL_OPTIM_FP8, 3) == 3 + 4 + 6 + 4 &&
          pl_optim_state_bytes(PL_OPTIM_ADAMW, -1) == -1 && pl_optim_state_bytes(PL_OPTIM_8BIT, INT64_MAX / 2) == -1);
    CHECK(pl_optim_from_name("adamw-fp8") == PL_OPTIM_FP8 && pl_optim_from_name("adamw8") == -1 &&
          pl_master_from_name("bf16-sr") == PL_MASTER_BF16_SR && pl_master_from_name("bf16") == -1 &&
          pl_master_from_name("f16-scaled") == PL_MASTER_F16S && pl_master_from_name("f16-scaled-sr") == PL_MASTER_F16S_SR);
    /* a scaled f16 master: 2 bytes per element + an f32 scale per block of
     * the state's block (256 with f32 moments); its blocks whole per rank */
    CHECK(pl_master_block(PL_OPTIM_ADAMW, PL_MASTER_F16S) == 256 && pl_master_block(PL_OPTIM_FP8, PL_MASTER_BF16_SR) == 0 &&
          pl_master_total_bytes(PL_OPTIM_FP8, PL_MASTER_F16S, 257) == 2 * 257 + 8 &&
          pl_master_total_bytes(PL_OPTIM_8BIT, PL_MASTER_BF16_SR, 257) == 2 * 257);
}

static double json_num(const char *out, const char *key)
{
    const char *k = strstr(out, key);
    return k ? strtod(k + strlen(key), NULL) : -1;
}

/* lpx mem --model llama3-8b --ranks 8 for each choice, pinned: every
 * dimension is a multiple of 256 and every row count of 8, so rank 0
 * holds P / 8 = 1003782656 elements in whole blocks and the bytes per
 * parameter are the formats' own: m + v 8 (f32), 2 + 8/256 = 2.03125
 * (8-bit), 1 + 8/256 = 1.03125 (4-bit), 3 + 8/256 = 3.03125 (fp8);
 * masters 4 (f32) and 2 (bf16-sr). lpx plan counts the same bytes (its
 * memory per GPU falls by exactly the difference) and fits a run that f32
 * AdamW does not; bad values are refused in one line. */
static void test_mem_optim_choices(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    static char out[65536];
    static const char *const rows[] = {
        "  adamw                  8        8.00000         4.00000     3.74 GiB     7.48 GiB     30.77 GiB",
        "  adamw8bit              8        2.03125         4.00000     3.74 GiB     1.90 GiB     25.19 GiB",
        "  adamw4bit              8        1.03125         4.00000     3.74 GiB   987.20 MiB     24.25 GiB",
        "  adamw-fp8              8        3.03125         4.00000     3.74 GiB     2.83 GiB     26.12 GiB",
        "  adamw                  8        8.00000         2.00000     1.87 GiB     7.48 GiB     28.90 GiB",
        "  adamw8bit              8        2.03125         2.00000     1.87 GiB     1.90 GiB     23.32 GiB",
        "  adamw4bit              8        1.03125         2.00000     1.87 GiB   987.20 MiB     22.38 GiB",
        "  adamw-fp8              8        3.03125         2.00000     1.87 GiB     2.83 GiB     24.25 GiB",
    };
    int rc = run("mem --model llama3-8b --ranks 8 --optim all", out, sizeof out);
    for (int i = 0; i < 4; i++) CHECKF(rc == 0 && strstr(out, rows[i]), "row %d missing: %d %s", i, rc, out);
    rc = run("mem --model llama3-8b --ranks 8 --optim all --master bf16-sr", out, sizeof out);
    for (int i = 4; i < 8; i++) CHECKF(rc == 0 && strstr(out, rows[i]), "row %d missing: %d %s", i, rc, out);
    /* the targets, from the table's bytes per parameter */
    static const char *const names[] = {"adamw8bit", "adamw4bit", "adamw-fp8"};
    static const double target[] = {2.05, 1.05, 3.05};
    for (int i = 0; i < 3; i++) {
        char args[256];
        snprintf(args, sizeof args, "mem --model llama3-8b --ranks 8 --optim %s --master bf16-sr", names[i]);
        rc = run(args, out, sizeof out);
        double st = json_num(out, "  state B/param "), ms = json_num(out, "  master B/param ");
        CHECKF(rc == 0 && st > 0 && st <= target[i] && ms == 2.0, "%s: state %g (target %g), master %g: %s", names[i],
               st, target[i], ms, out);
    }
    /* the defaults print what they printed before: no new line */
    rc = run("mem --model llama3-8b --ranks 8", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "  optimizer          7.48 GiB") && !strstr(out, "B/param") &&
           !strstr(out, "optimizer adamw"), "defaults: %d %s", rc, out);
    /* lpx plan: the same bytes, exactly (rank 0's 1003782656 elements) */
    const char *m = "plan --model llama3-8b --gpus 8 --json";
    char args[256];
    rc = run(m, out, sizeof out);
    double base = json_num(out, "\"memory_per_gpu_bytes\": ");
    CHECK(rc == 0 && base > 0 && !strstr(out, "\"optim\""));
    static const char *const opt[] = {"adamw8bit", "adamw4bit", "adamw-fp8"};
    static const double bpp[] = {2.03125, 1.03125, 3.03125};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 2; b++) {
            snprintf(args, sizeof args, "%s --optim %s --master %s", m, opt[i], b ? "bf16-sr" : "f32");
            rc = run(args, out, sizeof out);
            double mem = json_num(out, "\"memory_per_gpu_bytes\": ");
            double want = base - 1003782656.0 * ((8 - bpp[i]) + (b ? 2 : 0));
            CHECKF(rc == 0 && mem == want && json_num(out, "\"optim_state_bytes_per_param\": ") == bpp[i] &&
                   json_num(out, "\"master_bytes_per_param\": ") == (b ? 2 : 4),
                   "%s: memory %.0f, expected %.0f: %s", args, mem, want, out);
        }
    /* the optimizer step moves 2 x master + 2 x state + 4 bytes per element:
     * 28 for f32 AdamW, 12.0625 for 8-bit with bf16 masters */
    rc = run("plan --model llama3-8b --gpus 8 --optim adamw8bit --master bf16-sr --json", out, sizeof out);
    CHECKF(rc == 0 && json_num(out, "\"optim_step_bytes_per_element\": ") == 12.0625, "step bytes: %s", out);
    /* fit: llama3-8b on one 80 GiB GPU does not fit with f32 AdamW, fits with 4-bit states */
    rc = run("plan --model llama3-8b --gpus 1 --seq 4096", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "DOES NOT FIT"), "f32 AdamW on one GPU: %d %s", rc, out);
    rc = run("plan --model llama3-8b --gpus 1 --seq 4096 --optim adamw4bit", out, sizeof out);
    CHECKF(rc == 0 && !strstr(out, "DOES NOT FIT") && strstr(out, "tok/s/GPU") &&
           strstr(out, "optimizer: adamw4bit, masters f32: 1.03125 + 4.00000 bytes per parameter"),
           "4-bit on one GPU: %d %s", rc, out);
    /* bad values: one line, naming the option, exit 2 */
    static const char *const refused[][2] = {
        {"mem --optim adam", "lpx mem: --optim expects adamw, adamw8bit, adamw4bit or adamw-fp8 (or all), got 'adam'"},
        {"mem --master bf16", "lpx mem: --master expects f32, bf16-sr, f16-scaled or f16-scaled-sr, got 'bf16'"},
        {"mem --optim", "lpx mem: option needs a value: '--optim'"},
        {"plan --optim all", "lpx plan: --optim expects adamw, adamw8bit, adamw4bit or adamw-fp8, got all"},
        {"plan --master=fp16", "lpx plan: --master expects f32, bf16-sr, f16-scaled or f16-scaled-sr, got fp16"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        rc = run(refused[i][0], out, sizeof out);
        out[strcspn(out, "\n")] = 0;
        CHECKF(rc == 2 && !strcmp(out, refused[i][1]), "%s: %d '%s'", refused[i][0], rc, out);
    }
}

/* lpx mem's count of the optimizer state and masters equals what lpx
 * train measures on the engine's shards (its summary line, from rank 0's
 * state tensors) at a small width: the "within 2% of the measured
 * shards". */
static void test_mem_matches_engine_shards(void)
{
    if (!getenv("LPX_TEST_LPX_EXE")) SKIP_CASE("LPX_TEST_LPX_EXE is not set");
    char dir[] = "/tmp/lpx-test-memshards-XXXXXX";
    if (!mkdtemp(dir)) SKIP_CASE("mkdtemp failed");
    static char out[65536];
    /* and FP8-LM's scaled f16 master (f16 codes + an f32 scale per block),
     * with fp8 moments and with f32 moments */
    static const char *const names[] = {"adamw8bit", "adamw4bit", "adamw-fp8", "adamw-fp8", "adamw"};
    static const char *const masters[] = {"bf16-sr", "bf16-sr", "bf16-sr", "f16-scaled", "f16-scaled"};
    static const char *const geom = "--ranks 2 --dim 64 --layers 2 --optim %s --master %s";
    for (int i = 0; i < 5; i++) {
        char g[256], args[1024];
        snprintf(g, sizeof g, geom, names[i], masters[i]);
        snprintf(args, sizeof args, "train --recipe bf16 --steps 1 --out '%s/%s-%s' %s", dir, names[i], masters[i], g);
        int rc = run(args, out, sizeof out);
        const char *at = strstr(out, ": state ");
        double measured = at ? strtod(at + 8, NULL) : 0, master = 0;
        const char *mt = strstr(out, "masters ");
        if (mt) master = strtod(mt + 8, NULL);
        CHECKF(rc == 0 && measured > 0, "%s: lpx train rc %d, no measured state line: %s", names[i], rc, out);
        snprintf(args, sizeof args, "mem %s", g);
        rc = run(args, out, sizeof out);
        double st = json_num(out, "  state B/param "), ms = json_num(out, "  master B/param ");
        CHECKF(rc == 0 && fabs(st - measured) <= 0.02 * measured, "%s: lpx mem %g vs measured %g B/param", names[i], st,
               measured);
        CHECKF(fabs(ms - master) <= 0.02 * master, "%s: lpx mem masters %g vs measured %g", names[i], ms, master);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    if (lpx_init()) {
        printf("lpx_init failed: %s\n", lpx_last_error());
        return 1;
    }
    RUN(test_ring_and_tree);
    RUN(test_fully_overlapped);
    RUN(test_fully_exposed);
    RUN(test_sm_share);
    RUN(test_cli);
    RUN(test_cli_gqa_numbers);
    RUN(test_chip_file_from_benchmark);
    RUN(test_schedule_refuses_nonfinite);
    RUN(test_ranges);
    RUN(test_many_layers);
    RUN(test_chip_checks_and_mfu);
    RUN(test_no_speed_when_it_does_not_fit);
    RUN(test_optim_state_bytes_against_kinds);
    RUN(test_mem_optim_choices);
    RUN(test_mem_matches_engine_shards);
    return CHECK_DONE();
}
