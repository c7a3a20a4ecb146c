/* `lpx train --device sim`: the whole GPU trainer (uploads, device-resident
 * shards, bf16 activations, the chunked loss, device-side nonfinite
 * checks, gathered masters) on the simulated device of lpx-simdev.so, in
 * CI. Its kernels are the CPU's, so every step's loss must equal, bit for
 * bit (--log-exact), `--device cpu --act bf16`'s: every recipe but MX on
 * 2 ranks; bf16 and float8-tensorwise on 1, 2 and 4 ranks; --offload
 * (host shards, device compute) for bf16 and nf4-qlora; the chunked loss
 * and sampling; a planted NaN found by the device-side check; and the
 * refusals (MX, --save, more ranks than devices, --comm local). */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "run_util.h"

static char corpus[512], outdir[256];

#define SMALL "--dim 64 --layers 1 --heads 2 --seq 16 --batch 4 --steps 3 --pretrain 2 --eval 2 --sample 0 " \
              "--log-every 1 --log-exact"

/* the exact losses ("[0x...]") of the progress lines of `label`, in order */
static int exact_losses(const char *out, const char *label, char v[][40], int cap)
{
    int n = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "  %s ", label);
    for (const char *s = out; (s = strstr(s, pat)) && n < cap;) {
        const char *l = strstr(s, "loss "), *b = l ? strchr(l, '[') : NULL, *e = b ? strchr(b, ']') : NULL;
        const char *nl = strchr(s, '\n');
        if (!e || (nl && b > nl)) break;
        snprintf(v[n++], 40, "%.*s", (int)(e - b - 1), b + 1);
        s = e;
    }
    return n;
}

/* both: options of both runs; extra: of the sim run only (--offload) */
static void same_as_cpu(const char *recipe, int ranks, const char *both, const char *extra)
{
    static char a[1 << 16], b[1 << 16];
    char args[2048], la[8][40], lb[8][40];
    int micro = ranks > 2 ? ranks : 2;
    /* a device keeps activations in bf16 (f32: the all-f32 reference) */
    snprintf(args, sizeof args, "train --recipe %s --device cpu %s %s --ranks %d --micro %d " SMALL
             " --data '%s' --out '%s/cpu'", recipe, strcmp(recipe, "f32") ? "--act bf16" : "", both, ranks, micro,
             corpus, outdir);
    int ra = run(args, a, sizeof a);
    snprintf(args, sizeof args, "train --recipe %s --device sim %s %s --ranks %d --micro %d " SMALL
             " --data '%s' --out '%s/sim'", recipe, both, extra, ranks, micro, corpus, outdir);
    int rb = run(args, b, sizeof b);
    CHECKF(ra == 0 && rb == 0, "%s ranks %d %s: cpu exit %d, sim exit %d: %s", recipe, ranks, extra, ra, rb,
           rb ? b : a);
    int na = exact_losses(a, recipe, la, 8), nb = exact_losses(b, recipe, lb, 8);
    CHECKF(na == 3 && nb == 3, "%s ranks %d %s: %d cpu and %d sim steps", recipe, ranks, extra, na, nb);
    for (int i = 0; i < na && i < nb; i++)
        CHECKF(!strcmp(la[i], lb[i]), "%s ranks %d %s step %d: sim loss %s, cpu %s", recipe, ranks, extra, i + 1,
               lb[i], la[i]);
    CHECKF(strstr(b, "sim ranks"), "%s: the run did not say it ran on sim ranks", recipe);
    printf("  %-18s ranks %d %-9s 3 steps equal to the CPU's (last %s)\n", recipe, ranks, extra, nb ? lb[nb - 1] : "-");
}

static void test_every_recipe(void)
{
    static const char *recipes[] = {"f32", "bf16", "float8-tensorwise", "float8-rowwise", "float8-delayed",
                                    "float8-blockwise", "nf4-qlora"};
    for (size_t i = 0; i < sizeof recipes / sizeof *recipes; i++) same_as_cpu(recipes[i], 2, "", "");
}

static void test_ranks(void)
{
    for (int r = 1; r <= 4; r *= 2) {
        same_as_cpu("bf16", r, "", "");
        same_as_cpu("float8-tensorwise", r, "", "");
    }
}

static void test_offload(void)
{
    same_as_cpu("bf16", 2, "", "--offload");
    same_as_cpu("nf4-qlora", 4, "", "--offload");
}

/* the chunked loss (rows in chunks of 5: 64 rows per micro-batch make 13
 * chunks), and --sample (gathered masters, logits read back) */
static void test_chunked_loss_and_sample(void)
{
    same_as_cpu("bf16", 2, "--loss-chunk 5 --sample 8", "");
}

/* a NaN and an inf planted in a device gradient: found by the device-side
 * check, reported with the parameter and the rank, the step skipped */
static void test_nonfinite_on_device(void)
{
    static char out[1 << 16];
    char args[2048];
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --device sim --ranks 2 --micro 2 --inject-nan 2 "
             "--skip-nonfinite " SMALL " --data '%s' --out '%s/nan'", corpus, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "step 2: non-finite gradient in parameter b0.wq (rank 0): 1 NaN, 1 inf; optimizer "
                                  "step skipped (--skip-nonfinite)"), "sim --inject-nan: %d %s", rc, out);
}

static void test_refusals(void)
{
    static const char *const cases[][2] = {
        {"train --device sim --recipe mxfp8", "not on the simulated device"},
        {"train --device sim --save x", "--save is not available on a device yet"},
        {"train --device sim --ranks 16 --micro 16 --batch 16", "there are 8 simulated devices"},
        {"train --device sim --comm local", "--comm sim"},
        {"train --comm sim", "it needs --device sim"},
    };
    char out[4096];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run(cases[i][0], out, sizeof out);
        CHECKF(rc == 2 && strstr(out, cases[i][1]) && count_lines(out) == 1, "'%s': %d %s", cases[i][0], rc, out);
    }
}

int main(void)
{
    exe = getenv("LPX_TEST_LPX_EXE");
    const char *c = getenv("LPX_TEST_CORPUS");
    if (!exe || !c) {
        printf("LPX_TEST_LPX_EXE / LPX_TEST_CORPUS not set: skipping\n");
        return 77;
    }
    snprintf(corpus, sizeof corpus, "%s", c);
    snprintf(outdir, sizeof outdir, "/tmp/lpx-test-train-sim.%ld", (long)getpid());
    mkdir(outdir, 0777);
    RUN(test_every_recipe);
    RUN(test_ranks);
    RUN(test_offload);
    RUN(test_chunked_loss_and_sample);
    RUN(test_nonfinite_on_device);
    RUN(test_refusals);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", outdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", outdir);
    return CHECK_DONE();
}
