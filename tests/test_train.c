/* `lpx train` and `lpx mem` end to end: runs the built lpx executable
 * (LPX_TEST_LPX_EXE) on tiny models (seconds each) and checks exit codes,
 * losses, rank-count invariance, the files it writes, nf4-qlora's frozen
 * base, checkpoints (a run stopped, saved and resumed in a new process
 * continues bit for bit), the numerics guards and comm fault reports. With the argument `mpi`: `mpirun -np 2 lpx train --comm
 * mpi` against `--ranks 2` on the local comm (LPX_TEST_MPIRUN,
 * LPX_TEST_MPI_PLUGIN; skipped, 77, without either). */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "run_util.h"

static char corpus[256], outdir[256];

/* tiny model flags shared by the runs */
#define TINY "--dim 32 --layers 1 --heads 2 --seq 16 --batch 4 --eval 2 --sample 40 --log-every 1"

static void test_bad_options(void)
{
    static const char *const cases[][2] = {
        {"train --recipe nosuch", "unknown recipe 'nosuch'"},
        {"train --ranks 0", "--ranks '0'"},
        {"train --dim 50", "--dim 50 is not divisible by --heads 4"},
        {"train --heads 4 --kv-heads 3", "--heads 4 is not a multiple of --kv-heads 3"},
        {"train --dim 96 --heads 32", "head dim 3"},
        {"train --model llama9", "unknown --model 'llama9'"},
        {"train --seq 32 --data /nonexistent.bin", "give the model's vocabulary"},
        {"train --dim 64 --heads 3", "not divisible by --heads"},
        {"train --ranks 3", "not divisible by --ranks 3"},
        {"train --batch 6", "not divisible by --micro"},
        {"train --comm nccl", "--comm nccl gathers GPU memory: it needs --device cuda"},
        {"train --device cuda", "--device cuda"},
        {"train --offload", "--offload keeps the shards in host memory while a GPU computes: it needs --device cuda"},
        {"train --device cuda --comm local", "--device cuda runs its collectives over NCCL"},
        {"train --act f16", "unknown --act 'f16' (f32, bf16)"},
        {"train --recipe f32 --act bf16", "--recipe f32 is the all-f32 reference"},
        {"train --loss-chunk 0", "--loss-chunk"},
        {"train --wrap nope", "unknown --wrap"},
        {"train --steps", "needs a value"},
        {"train --bogus 1", "unknown option '--bogus'"},
        {"train --bogus", "unknown option '--bogus'"},            /* not "needs a value" */
        {"train --steps=0", "--steps '0': expected an integer"},   /* --opt=value is read */
        {"train --quiet=1", "option --quiet takes no value"},
        {"train --data /etc", "corpus '/etc' is a directory"},
        {"mem --bogus", "unknown option"},
        {"mem --ranks=0", "--ranks expects"},
        {"eval --bogus", "unknown option '--bogus'"},
        {"train --init x.bin", "--init 'x.bin' is not a directory"},
        {"train --recipe nf4-qlora --save-hf x", "--save-hf writes a dense model"},
        {"mem --recipe nosuch", "unknown recipe"},
        {"mem --model nosuch", "unknown --model 'nosuch'"},
        {"mem --params 7e9 --model llama3-8b", "give --params or --model"},
        {"mem --ranks 2,x", "--ranks expects"},
    };
    char out[4096];
    /* an output path that cannot be written is refused before step 1 */
    char save_args[1024];
    snprintf(save_args, sizeof save_args, "mkdir -p '%s/mine' && touch '%s/mine/keep.txt'", outdir, outdir);
    CHECK(system(save_args) == 0);
    snprintf(save_args, sizeof save_args, "train --steps 1 --save '%s/mine'", outdir);
    int src = run(save_args, out, sizeof out);
    CHECKF(src == 2 && strstr(out, "exists and is not an lpx checkpoint (it holds 'keep.txt'") && count_lines(out) == 1,
           "--save onto another directory: %d %s", src, out);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run(cases[i][0], out, sizeof out);
        CHECKF(rc == 2, "'%s' exited %d", cases[i][0], rc);
        CHECKF(strstr(out, cases[i][1]) != NULL, "'%s' printed: %s", cases[i][0], out);
        CHECKF(count_lines(out) == 1, "'%s' printed %d lines: %s", cases[i][0], count_lines(out), out);
    }
    /* mxfp4 without the plugin: hide it (no LPX_PLUGIN_PATH, a copy of the
     * executable away from the build tree) */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/lpx-copy' && chmod +x '%s/lpx-copy'", exe, outdir, outdir);
    if (system(cmd) == 0) {
        snprintf(cmd, sizeof cmd, "env -u LPX_PLUGIN_PATH '%s/lpx-copy' train --recipe mxfp4 --data '%s' 2>&1", outdir,
                 corpus);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        int st = p ? pclose(p) : -1;
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 2, "mxfp4 without plugin: %s", out);
        CHECKF(strstr(out, "lpx-mx.so") != NULL && count_lines(out) == 1, "mxfp4 without plugin printed: %s", out);
    }
    static char help[16384];
    CHECK(run("train --help", help, sizeof help) == 0 && strstr(help, "--recipe") && strstr(help, "--loss-chunk"));
}


static double val_of(const char *out, const char *label)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %-20s ", label);
    const char *s = strstr(out, pat);
    if (!s) return -1;
    double tr, val;
    if (sscanf(s + strlen(pat), "%lf %lf", &tr, &val) != 2) return -1;
    return val;
}

/* The first loss of every preset from scratch is about ln(vocab): the
 * weights start as transformers' LlamaForCausalLM does (normal 0.02 for
 * the embedding, the linears and an untied head, ones for the norms), so
 * the logits start near uniform. Each preset at a small width (dim 128,
 * one block) on the byte corpus, one f32 step. Before: embedding std 0.1
 * (the tied head of llama3.2-* too) and linears 1/sqrt(fan-in): 12.58 and
 * 12.70 here (7-8 % over ln(128256) = 11.76; 33.3 at the full 1B width),
 * tiny 6.42 (16 % over ln 256). Now within 5 % (measured 11.40 tied,
 * 11.85 untied, tiny 5.62). And (issue 35, E) the byte corpus under a
 * 128256-token vocabulary is said in one warning line. */
static void test_first_loss_every_preset(void)
{
    static const char *const presets[] = {"llama3-8b", "llama3-70b", "llama3-405b", "llama3.2-1b", "llama3.2-3b", "tiny"};
    static char out[65536];
    char args[4096];
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        bool tiny = !strcmp(presets[i], "tiny");
        snprintf(args, sizeof args, "train --model %s --dim 128 --heads 8 --kv-heads 4 --ffn 64 --layers 1 --recipe f32 "
                 "--ranks 1 --micro 1 --batch 1 --steps 1 --seq 16 --eval 1 --sample 0 --data '%s' --out '%s/preset'",
                 presets[i], corpus, outdir);
        int rc = run(args, out, sizeof out);
        double l[2];
        int n = train_losses(out, "f32", l, 2);
        double want = log(tiny ? 256.0 : 128256.0);
        CHECKF(rc == 0 && n == 1 && fabs(l[0] - want) <= 0.05 * want, "--model %s: exit %d, first loss %.4f, ln(vocab) "
               "%.4f: %s", presets[i], rc, n ? l[0] : NAN, want, out);
        printf("  %-12s first loss %.4f, ln(vocab) %.4f\n", presets[i], n ? l[0] : NAN, want);
        const char *w = strstr(out, "warning: corpus");
        if (tiny) {
            CHECKF(!w, "tiny (vocab 256) warned: %s", out);
        } else {
            CHECKF(w && strstr(w, "vocabulary is 128256: 128000 embedding rows never see a token") &&
                   !strstr(w + 1, "warning: corpus"), "--model %s on bytes: no (or more than one) warning: %s",
                   presets[i], out);
        }
    }
}

static void test_loss_goes_down_and_files(void)
{
    static char out[65536];
    char args[4096];
    /* 60 steps: from the transformers-style init (issue 35) this model
     * leaves the unigram plateau (~3.3) around step 30, where float8 and
     * bf16 part by a few % for a step or two; by 60 they agree to 0.3 % */
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 60 --lr 1e-2 "
             TINY " --compare --data '%s' --out '%s/run'", corpus, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "train exited %d: %s", rc, out);
    double l[128];
    int n = train_losses(out, "float8-tensorwise", l, 128);
    CHECKF(n >= 60, "%d progress lines", n);
    if (n >= 60) CHECKF(l[n - 1] < l[0] - 0.5, "loss %.3f -> %.3f", l[0], l[n - 1]);
    double v8 = val_of(out, "float8-tensorwise"), vb = val_of(out, "bf16");
    CHECKF(v8 > 0 && vb > 0 && fabs(v8 - vb) / vb < 0.05, "val float8 %.4f bf16 %.4f", v8, vb);
    CHECK(strstr(out, "amax all-reduces per step: 1") != NULL);
    CHECK(strstr(out, "no fallbacks") != NULL);
    CHECK(strstr(out, "sample (") != NULL);

    /* metrics.csv: header, 60 rows per recipe, val on the last row, complete marker */
    char path[512];
    snprintf(path, sizeof path, "%s/run/metrics.csv", outdir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        char line[512];
        int rows = 0, complete = 0, f8 = 0, bf = 0;
        CHECK(fgets(line, sizeof line, f) && !strncmp(line, "recipe,step,train_loss,val_loss", 31));
        while (fgets(line, sizeof line, f)) {
            if (!strcmp(line, "# complete\n")) complete = 1;
            else {
                rows++;
                f8 += !strncmp(line, "float8-tensorwise,", 18);
                bf += !strncmp(line, "bf16,", 5);
                int commas = 0;
                for (char *c = line; *c; c++) commas += *c == ',';
                CHECKF(commas == 6, "bad row %s", line);
            }
        }
        fclose(f);
        CHECK(rows == 120 && f8 == 60 && bf == 60 && complete);
    }
    snprintf(path, sizeof path, "%s/run/loss.svg", outdir);
    f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        static char svg[65536];
        size_t k = fread(svg, 1, sizeof svg - 1, f);
        svg[k] = 0;
        fclose(f);
        CHECK(!strncmp(svg, "<svg ", 5) && strstr(svg, "</svg>\n") != NULL);
        int poly = 0;
        for (const char *s = svg; (s = strstr(s, "<polyline")); s++) poly++;
        CHECK(poly == 2);
        CHECK(strstr(svg, "optimizer step") && strstr(svg, "float8-tensorwise") && strstr(svg, ">bf16<"));
    }
    /* no temp files left behind */
    snprintf(args, sizeof args, "ls -a '%s/run' | grep -c tmp", outdir);
    FILE *p = popen(args, "r");
    char cnt[16] = "";
    if (p) {
        if (!fgets(cnt, sizeof cnt, p)) cnt[0] = 0;
        pclose(p);
    }
    CHECK(atoi(cnt) == 0);
}

/* the engine's statistics in the summary: fp8 all-gather about half of
 * bf16's bytes (on a model whose block linears dominate), exactly one
 * amax all-reduce per step, at most two groups unsharded */
static void test_engine_stats(void)
{
    static char out[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 3 --dim 64 --layers 2 "
             "--heads 2 --seq 16 --batch 4 --eval 2 --sample 0 --log-every 1 --compare --data '%s' --out '%s/eng'",
             corpus, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "train exited %d: %s", rc, out);
    const char *r = strstr(out, "all-gather bytes float8-tensorwise / bf16 = ");
    CHECKF(r != NULL, "no all-gather ratio: %s", out);
    if (r) {
        double ratio = atof(r + strlen("all-gather bytes float8-tensorwise / bf16 = "));
        /* fp8 halves the block linears' bytes (106496 params); the embedding,
         * head and norms (33088) stay bf16: above 0.5, and below the ratio
         * of gathering every parameter equally often, (106496 + 2 * 33088) /
         * (2 * 139584) = 0.619 (the backward re-gathers blocks, not the
         * embedding) */
        CHECKF(ratio > 0.5 && ratio < 0.619, "fp8 / bf16 all-gather bytes %.3f", ratio);
    }
    const char *a = strstr(out, "amax all-reduces per step: ");
    CHECKF(a && atoi(a + strlen("amax all-reduces per step: ")) == 1, "amax all-reduces: %s", a ? a : out);
    const char *pk = strstr(out, "float8-tensorwise    unshards per step ");
    CHECKF(pk && strstr(pk, "peak unsharded 2 groups"), "peak unsharded groups: %s", pk ? pk : out);
}

static void test_ranks_same_losses(void)
{
    static char o1[32768], o2[32768];
    char args[4096];
    const char *recipes[] = {"bf16", "float8-tensorwise"};
    for (int r = 0; r < 2; r++) {
        snprintf(args, sizeof args, "train --recipe %s --ranks 1 --micro 2 --steps 6 " TINY
                 " --data '%s' --out '%s/r1'", recipes[r], corpus, outdir);
        CHECK(run(args, o1, sizeof o1) == 0);
        snprintf(args, sizeof args, "train --recipe %s --ranks 2 --micro 2 --steps 6 " TINY
                 " --data '%s' --out '%s/r2'", recipes[r], corpus, outdir);
        CHECK(run(args, o2, sizeof o2) == 0);
        double a[16], b[16];
        int na = train_losses(o1, recipes[r], a, 16), nb = train_losses(o2, recipes[r], b, 16);
        CHECKF(na == 6 && nb == 6, "%d and %d losses", na, nb);
        /* printed with 4 decimals; the CSVs hold 6: compare those exactly */
        for (int i = 0; i < na && i < nb; i++) CHECKF(a[i] == b[i], "%s step %d: %.6f vs %.6f", recipes[r], i + 1, a[i], b[i]);
        char c1[4096], c2[8];
        snprintf(c1, sizeof c1, "cut -d, -f1-4 '%s/r1/metrics.csv' > '%s/r1.cut' && cut -d, -f1-4 '%s/r2/metrics.csv' > "
                 "'%s/r2.cut' && cmp -s '%s/r1.cut' '%s/r2.cut'", outdir, outdir, outdir, outdir, outdir, outdir);
        CHECKF(system(c1) == 0, "%s: metrics differ between --ranks 1 and 2", recipes[r]);
        (void)c2;
    }
}

/* measured activations of a run's summary ("... activations measured") */
static double act_mib(const char *out, const char *recipe, const char *which)
{
    char key[128];
    snprintf(key, sizeof key, "  %-20s ", recipe);
    const char *s = strstr(out, "peak memory per rank");
    s = s ? strstr(s, key) : NULL;
    if (s && !strcmp(which, "estimate")) s = strstr(s + 1, "\n");
    double v[5] = {0};
    if (s && sscanf(s + (which[0] == 'e' ? 1 : strlen(key)), " %lf MiB %lf MiB %lf MiB %lf MiB %lf MiB", &v[0], &v[1],
                    &v[2], &v[3], &v[4]) == 5)
        return v[4];
    return NAN;
}

/* --ac full: the same losses bit for bit (the recomputed blocks are the
 * same computation), fewer activation bytes, and the estimate within 10%
 * of the measurement (a GQA model with a tied head) */
static void test_activation_checkpointing(void)
{
    static char o1[32768], o2[32768];
    char args[4096];
    const char *model = "--heads 4 --kv-heads 1 --tied --layers 3";
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 4 " TINY " %s --log-exact "
             "--data '%s' --out '%s/ac0'", model, corpus, outdir);
    CHECK(run(args, o1, sizeof o1) == 0);
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 4 " TINY " %s --log-exact "
             "--ac full --data '%s' --out '%s/ac1'", model, corpus, outdir);
    CHECK(run(args, o2, sizeof o2) == 0);
    double a[8], b[8];
    int na = train_losses(o1, "float8-tensorwise", a, 8), nb = train_losses(o2, "float8-tensorwise", b, 8);
    CHECKF(na == 4 && nb == 4, "%d and %d losses", na, nb);
    for (int i = 0; i < na && i < nb; i++) CHECKF(a[i] == b[i], "step %d: %.6f vs %.6f", i + 1, a[i], b[i]);
    double m0 = act_mib(o1, "float8-tensorwise", "measured"), m1 = act_mib(o2, "float8-tensorwise", "measured");
    double e1 = act_mib(o2, "float8-tensorwise", "estimate");
    CHECKF(m1 < 0.8 * m0, "activations %.2f MiB with --ac full, %.2f without", m1, m0);
    CHECKF(fabs(e1 - m1) <= 0.1 * m1, "--ac full: estimate %.2f MiB, measured %.2f", e1, m1);
    const char *s = strstr(o2, "estimate (worst ");
    CHECKF(s && atof(s + strlen("estimate (worst ")) <= 10.0, "estimate off: %s", s ? s : o2);
}

/* --act bf16 (the GPU's default) on the CPU: every recipe trains with
 * bf16 activations to losses within 2% of its f32-activation run, with
 * about half the activation memory, which lpx mem predicts within 10% */
static void test_bf16_activations(void)
{
    static char o1[32768], o2[32768];
    static const char *const recipes[] = {"bf16", "float8-tensorwise", "float8-rowwise", "nf4-qlora", "mxfp8"};
    for (size_t r = 0; r < sizeof recipes / sizeof *recipes; r++) {
        const char *rc = recipes[r];
        char args[4096];
        snprintf(args, sizeof args, "train --recipe %s --ranks 2 --micro 2 --steps 6 --pretrain 4 " TINY
                 " --act f32 --data '%s' --out '%s/act32'", rc, corpus, outdir);
        CHECKF(run(args, o1, sizeof o1) == 0, "%s --act f32: %s", rc, o1);
        snprintf(args, sizeof args, "train --recipe %s --ranks 2 --micro 2 --steps 6 --pretrain 4 " TINY
                 " --act bf16 --data '%s' --out '%s/act16'", rc, corpus, outdir);
        CHECKF(run(args, o2, sizeof o2) == 0, "%s --act bf16: %s", rc, o2);
        double a[8], b[8];
        int na = train_losses(o1, rc, a, 8), nb = train_losses(o2, rc, b, 8);
        /* (nf4-qlora's summary line "nf4-qlora: val loss ..." is a 7th match) */
        CHECKF(na >= 6 && na == nb, "%s: %d and %d losses", rc, na, nb);
        for (int i = 0; i < 6 && i < na && i < nb; i++)
            CHECKF(fabs(a[i] - b[i]) <= 0.02 * a[i], "%s step %d: f32 activations %.5f, bf16 %.5f", rc, i + 1, a[i],
                   b[i]);
        double m32 = act_mib(o1, rc, "measured"), m16 = act_mib(o2, rc, "measured"), e16 = act_mib(o2, rc, "estimate");
        CHECKF(m16 > 0 && m16 < 0.6 * m32, "%s: activations %.2f MiB in bf16, %.2f in f32", rc, m16, m32);
        CHECKF(fabs(e16 - m16) <= 0.1 * m16, "%s --act bf16: estimate %.2f MiB, measured %.2f", rc, e16, m16);
    }
}

/* lpx mem counts a blockwise float8 weight's shard at whole 128-row
 * blocks (torch.chunk of the shard unit): at 2 ranks rank 0 holds every
 * row of a 352-row weight's first 256 (2 of 3 blocks), not half of them,
 * and the estimate of params, grads and optimizer state follows
 * (regression: 38% off before) */
static void test_mem_blockwise_shards(void)
{
    static char out[32768];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe float8-blockwise --ranks 2 --micro 2 --steps 2 " TINY
             " --dim 128 --data '%s' --out '%s/blk'", corpus, outdir);
    CHECK(run(args, out, sizeof out) == 0);
    const char *s = strstr(out, "estimate (worst ");
    CHECKF(s && atof(s + strlen("estimate (worst ")) <= 10.0, "float8-blockwise at 2 ranks: %s", s ? s : out);
}

static int hex_losses(const char *out, const char *label, int *step, char (*hex)[40], int cap);

/* the count of `op`'s calls in the dispatch table at the end of a run
 * ("  OP  cpu  N  fallbacks"); -1 when absent */
static long dispatch_calls(const char *out, const char *op)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %s ", op);
    const char *s = strstr(out, "dispatch counts");
    s = s ? strstr(s, pat) : NULL;
    char key[32];
    long n = -1;
    if (!s || sscanf(s + strlen(pat), " %31s %ld", key, &n) != 2) return -1;
    return n;
}

/* --loss-chunk: the LM head and the loss in chunks of rows. One rank
 * runs micro-batches of 4 x 16 = 64 rows: --loss-chunk 22 cuts them into
 * 3 chunks (22, 22, 20), --loss-chunk 16 into 4, --loss-chunk 64 leaves
 * one (the default at this size). The chunk count is read from the
 * dispatch table: the loss's backward runs once per chunk per training
 * micro-batch (5 steps x 1 micro-batch), so 15 and 20 calls against 5.
 * The losses: one chunk equals the default bit for bit; 3 and 4 chunks
 * give the same loss up to f32 rounding: each chunk's mean is weighted
 * by its share of the targets and summed in f32, and the head's gradient
 * is summed chunk by chunk in f32, a few more roundings per step (1-2
 * ulps of a loss near 6 were seen, 2.4e-7 relative): 1e-6 relative is
 * about 8 ulps, while one chunk's loss dropped or counted twice moves
 * the loss by a third or more. */
static void test_loss_chunks(void)
{
    static char o1[32768], o2[32768];
    const char *chunks[] = {"--loss-chunk 64", "--loss-chunk 22", "--loss-chunk 16"};
    const long nchunks[] = {1, 3, 4};
    char args[4096];
    snprintf(args, sizeof args, "train --recipe bf16 --ranks 1 --micro 1 --steps 5 " TINY " --log-exact --data '%s' "
             "--out '%s/lc0'", corpus, outdir);
    CHECK(run(args, o1, sizeof o1) == 0);
    long base = dispatch_calls(o1, "cross_entropy_backward");
    CHECKF(base == 5, "one chunk: %ld cross_entropy_backward calls for 5 micro-batches", base);
    for (int k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "train --recipe bf16 --ranks 1 --micro 1 --steps 5 " TINY " --log-exact %s "
                 "--data '%s' --out '%s/lc1'", chunks[k], corpus, outdir);
        CHECK(run(args, o2, sizeof o2) == 0);
        long calls = dispatch_calls(o2, "cross_entropy_backward");
        CHECKF(calls == 5 * nchunks[k], "%s: %ld cross_entropy_backward calls, expected %ld chunks x 5", chunks[k],
               calls, nchunks[k]);
        int s1[8], s2[8];
        char h1[8][40], h2[8][40];
        int na = hex_losses(o1, "bf16", s1, h1, 8), nb = hex_losses(o2, "bf16", s2, h2, 8);
        CHECKF(na == 5 && nb == 5, "%d and %d losses", na, nb);
        for (int i = 0; i < na && i < nb; i++) {
            double a = strtod(h1[i], NULL), b = strtod(h2[i], NULL);
            if (nchunks[k] == 1) CHECKF(!strcmp(h1[i], h2[i]), "%s step %d: %s vs default %s", chunks[k], i + 1, h2[i], h1[i]);
            else CHECKF(fabs(a - b) <= 1e-6 * a, "%s step %d: %.9g vs one chunk %.9g", chunks[k], i + 1, b, a);
        }
    }
}

static void test_nf4_qlora(void)
{
    static char out[65536];
    char args[4096];
    /* a base past the unigram plateau (~3.5, where the transformers-style
     * init of issue 35 leaves 20 bf16 steps), so the adapters have more
     * than noise to learn on two validation batches */
    snprintf(args, sizeof args, "train --recipe nf4-qlora --ranks 2 --micro 2 --steps 12 --pretrain 40 --lr 1e-2 "
             TINY " --dim 64 --lora-rank 4 --data '%s' --out '%s/nf4'", corpus, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "nf4 exited %d: %s", rc, out);
    const char *s = strstr(out, "val loss of the pre-trained base ");
    CHECK(s != NULL);
    if (s) {
        double before = 0, after = 0;
        CHECK(sscanf(s, "val loss of the pre-trained base %lf -> %lf", &before, &after) == 2);
        CHECKF(after < before, "nf4-qlora val %.4f -> %.4f", before, after);
    }
    s = strstr(out, "bits/param; trainable (adapters): ");
    CHECK(s != NULL);
    if (s) {
        long long trainable = atoll(s + strlen("bits/param; trainable (adapters): "));
        /* one block: 7 linears, rank 4 adapters = 4 * (out + in) each */
        long long expect = 4LL * (4 * (64 + 64) + 2 * (192 + 64) + (64 + 192));
        CHECKF(trainable == expect, "trainable %lld, expected %lld (adapters only)", trainable, expect);
    }
    CHECK(strstr(out, "4.1") != NULL); /* ~4.13 bits per parameter (small tensors pad a little more) */
    /* the pre-trained base is a Hugging Face folder (OUT/base), given back
     * with --init: its config.json sets the model, so the model's options
     * (TINY's --dim, --layers, --heads) are refused beside it */
    CHECK(strstr(out, "base checkpoint: ") && strstr(out, "/nf4/base (Hugging Face)"));
    snprintf(args, sizeof args, "train --recipe nf4-qlora --ranks 1 --micro 2 --steps 3 --seq 16 --batch 4 --eval 2 "
             "--sample 40 --log-every 1 --lora-rank 4 --init '%s/nf4/base' --data '%s' --out '%s/nf4b'", outdir, corpus,
             outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "nf4 --init exited %d: %s", rc, out);
    CHECK(strstr(out, "initial weights: ") && strstr(out, "/nf4/base (Hugging Face)"));
    snprintf(args, sizeof args, "train --recipe nf4-qlora --steps 3 " TINY " --init '%s/nf4/base' --data '%s' --out '%s/nf4c'",
             outdir, corpus, outdir);
    CHECK(run(args, out, sizeof out) == 2 && strstr(out, "sets the model from its config.json"));
}

/* ---- checkpoints ---- */

/* the exact losses ("[%a]" of --log-exact) of the progress lines of
 * `label`, in order: "  LABEL step    N/M  loss X [HEX]" */
static int hex_losses(const char *out, const char *label, int *step, char (*hex)[40], int cap)
{
    int n = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "  %-18s step ", label);
    for (const char *s = out; (s = strstr(s, pat)) && n < cap; s++) {
        const char *l = strstr(s, " ["), *e = l ? strchr(l, ']') : NULL, *nl = strchr(s, '\n');
        if (!l || !e || (nl && l > nl) || e - l - 2 >= 40) continue;
        step[n] = atoi(s + strlen(pat));
        snprintf(hex[n], 40, "%.*s", (int)(e - l - 2), l + 2);
        n++;
    }
    return n;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool same_file(const char *a, const char *b)
{
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

/* N steps straight vs N/2, --save, and a NEW process that resumes for the
 * other N/2 (also on another rank count): the same losses to the last bit
 * (printed with %a), the same metrics.csv losses (train and validation),
 * and bit-identical final checkpoints (weights, AdamW state, float8
 * delayed-scaling histories). */
static void resume_exact(const char *recipe, const char *extra, bool delayed, bool rank_invariant)
{
    static char o1[65536], o2[65536], o3[65536], o4[65536];
    char args[4096], a[512], b[512];
    const char *common = "--ranks 2 --micro 2 --steps 8 --log-exact " TINY;
    double t0 = wall_s();
    snprintf(args, sizeof args, "train --recipe %s %s %s --data '%s' --out '%s/%s-straight' --save '%s/%s-ck-straight'",
             recipe, extra, common, corpus, outdir, recipe, outdir, recipe);
    int rc = run(args, o1, sizeof o1);
    CHECKF(rc == 0, "%s straight: exit %d: %s", recipe, rc, o1);
    snprintf(args, sizeof args, "train --recipe %s %s %s --stop-after 4 --data '%s' --out '%s/%s-half' --save "
             "'%s/%s-ck-half'", recipe, extra, common, corpus, outdir, recipe, outdir, recipe);
    rc = run(args, o2, sizeof o2);
    CHECKF(rc == 0, "%s first half: exit %d: %s", recipe, rc, o2);
    /* the second half: options come from the manifest (only --log-exact,
     * --out and --save given) */
    snprintf(args, sizeof args, "train --resume '%s/%s-ck-half' --log-exact --log-every 1 --sample 40 --out '%s/%s-rest' "
             "--save '%s/%s-ck-rest'", outdir, recipe, outdir, recipe, outdir, recipe);
    rc = run(args, o3, sizeof o3);
    CHECKF(rc == 0, "%s resumed: exit %d: %s", recipe, rc, o3);
    CHECKF(strstr(o3, "resuming") && strstr(o3, "at step 4"), "%s resumed: %s", recipe, o3);
    /* and again on one rank (1 vs 2 ranks with --micro 2 are bit-identical) */
    snprintf(args, sizeof args, "train --resume '%s/%s-ck-half' --ranks 1 --log-exact --log-every 1 --sample 40 "
             "--out '%s/%s-rest1' --save '%s/%s-ck-rest1'", outdir, recipe, outdir, recipe, outdir, recipe);
    rc = run(args, o4, sizeof o4);
    CHECKF(rc == 0, "%s resumed on 1 rank: exit %d: %s", recipe, rc, o4);

    int s1[16], s2[16], s3[16], s4[16];
    char h1[16][40], h2[16][40], h3[16][40], h4[16][40];
    int n1 = hex_losses(o1, recipe, s1, h1, 16), n2 = hex_losses(o2, recipe, s2, h2, 16),
        n3 = hex_losses(o3, recipe, s3, h3, 16), n4 = hex_losses(o4, recipe, s4, h4, 16);
    CHECKF(n1 == 8 && n2 == 4 && n3 == 4 && n4 == 4, "%s: %d, %d, %d, %d exact losses", recipe, n1, n2, n3, n4);
    for (int i = 0; i < n2 && i < 4 && n1 == 8; i++)
        CHECKF(s2[i] == i + 1 && !strcmp(h1[i], h2[i]), "%s step %d: straight %s, first half %s", recipe, i + 1, h1[i],
               h2[i]);
    for (int i = 0; i < 4 && n1 == 8 && n3 == 4 && n4 == 4; i++) {
        CHECKF(s3[i] == i + 5 && !strcmp(h1[i + 4], h3[i]), "%s step %d: straight %s, resumed %s", recipe, i + 5,
               h1[i + 4], h3[i]);
        /* on 1 rank: bit for bit where the recipe is rank-count invariant
         * (docs/TRAIN.md), else it continues within 1% */
        CHECKF(s4[i] == i + 5 && (rank_invariant ? !strcmp(h1[i + 4], h4[i])
                                                 : fabs(strtod(h1[i + 4], NULL) / strtod(h4[i], NULL) - 1) < 0.01),
               "%s step %d: straight %s, resumed on 1 rank %s", recipe, i + 5, h1[i + 4], h4[i]);
    }
    /* metrics.csv: every step's train loss and the final validation loss */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "grep '^%s,' '%s/%s-straight/metrics.csv' | cut -d, -f1-4 > '%s/%s-a.cut' && grep '^%s,' "
             "'%s/%s-rest/metrics.csv' | cut -d, -f1-4 > '%s/%s-b.cut' && cmp -s '%s/%s-a.cut' '%s/%s-b.cut'", recipe,
             outdir, recipe, outdir, recipe, recipe, outdir, recipe, outdir, recipe, outdir, recipe, outdir, recipe);
    CHECKF(system(cmd) == 0, "%s: metrics.csv losses differ between the straight and the resumed run", recipe);
    /* the sample generated after training too */
    const char *x = strstr(o1, "\nsample ("), *y = strstr(o3, "\nsample (");
    CHECKF(x && y && !strcmp(x, y), "%s: samples differ: %s / %s", recipe, x ? x : "none", y ? y : "none");
    /* the final checkpoints, rank file by rank file (weights, AdamW state,
     * float8-delayed histories), bit for bit */
    (void)delayed;
    for (int r = 0; r < 2; r++) {
        snprintf(a, sizeof a, "%s/%s-ck-straight/rank-%05d-of-00002.safetensors", outdir, recipe, r);
        snprintf(b, sizeof b, "%s/%s-ck-rest/rank-%05d-of-00002.safetensors", outdir, recipe, r);
        CHECKF(same_file(a, b), "%s: rank %d's file differs between the straight and the resumed run", recipe, r);
    }
    if (rank_invariant) {
        /* the run resumed on 1 rank, its checkpoint re-saved on 2 with no
         * step (--stop-after at the checkpoint's step): the same files */
        static char o5[65536];
        snprintf(args, sizeof args, "train --resume '%s/%s-ck-rest1' --ranks 2 --stop-after 8 --sample 0 --out "
                 "'%s/%s-rest1to2' --save '%s/%s-ck-rest1to2'", outdir, recipe, outdir, recipe, outdir, recipe);
        rc = run(args, o5, sizeof o5);
        CHECKF(rc == 0, "%s re-saved on 2 ranks: exit %d: %s", recipe, rc, o5);
        for (int r = 0; r < 2; r++) {
            snprintf(a, sizeof a, "%s/%s-ck-straight/rank-%05d-of-00002.safetensors", outdir, recipe, r);
            snprintf(b, sizeof b, "%s/%s-ck-rest1to2/rank-%05d-of-00002.safetensors", outdir, recipe, r);
            CHECKF(same_file(a, b), "%s: rank %d's file differs between the straight run and the one resumed on 1 "
                   "rank", recipe, r);
        }
    }
    printf("     %s: 8 steps straight = 4 + resume + 4 (2 ranks%s), losses equal in all bits, e.g. step 8 %s; "
           "%.2f s for the 4 runs\n", recipe, rank_invariant ? "; resumed on 1 rank too" : "", n1 == 8 ? h1[7] : "?",
           wall_s() - t0);
}

/* A checkpoint saved after the first step (the earliest one: --stop-after
 * takes 1..steps, so there is no step-0 checkpoint) resumes bit for bit:
 * AdamW's step count 1 (its bias corrections 1 - beta^1), the float8
 * delayed histories holding one amax each and the data position after
 * one batch all come back. 4 steps straight = 1 + resume + 3, the exact
 * losses of steps 2..4 and the final rank files equal. */
static void test_resume_at_step_1(void)
{
    static char o1[65536], o2[65536], o3[65536];
    static const char *const recipes[] = {"bf16", "float8-delayed"};
    const char *common = "--ranks 2 --micro 2 --steps 4 --log-exact " TINY;
    for (int k = 0; k < 2; k++) {
        const char *r = recipes[k];
        char args[4096], a[600], b[600];
        snprintf(args, sizeof args, "train --recipe %s %s --data '%s' --out '%s/s1-%s' --save '%s/s1-%s-ck4'", r,
                 common, corpus, outdir, r, outdir, r);
        CHECKF(run(args, o1, sizeof o1) == 0, "%s straight: %s", r, o1);
        snprintf(args, sizeof args, "train --recipe %s %s --stop-after 1 --data '%s' --out '%s/s1-%s' --save "
                 "'%s/s1-%s-ck1'", r, common, corpus, outdir, r, outdir, r);
        CHECKF(run(args, o2, sizeof o2) == 0, "%s step 1: %s", r, o2);
        snprintf(args, sizeof args, "train --resume '%s/s1-%s-ck1' --log-exact --log-every 1 --out '%s/s1-%s' --save "
                 "'%s/s1-%s-ckr'", outdir, r, outdir, r, outdir, r);
        CHECKF(run(args, o3, sizeof o3) == 0 && strstr(o3, "at step 1"), "%s resumed at step 1: %s", r, o3);
        int s1[8], s2[8], s3[8];
        char h1[8][40], h2[8][40], h3[8][40];
        int n1 = hex_losses(o1, r, s1, h1, 8), n2 = hex_losses(o2, r, s2, h2, 8), n3 = hex_losses(o3, r, s3, h3, 8);
        CHECKF(n1 == 4 && n2 == 1 && n3 == 3, "%s: %d, %d, %d exact losses", r, n1, n2, n3);
        if (n1 == 4 && n2 == 1) CHECKF(!strcmp(h1[0], h2[0]), "%s step 1: %s vs %s", r, h1[0], h2[0]);
        for (int i = 0; n1 == 4 && i < n3 && i < 3; i++)
            CHECKF(s3[i] == i + 2 && !strcmp(h1[i + 1], h3[i]), "%s step %d: straight %s, resumed %s", r, i + 2,
                   h1[i + 1], h3[i]);
        for (int q = 0; q < 2; q++) {
            snprintf(a, sizeof a, "%s/s1-%s-ck4/rank-%05d-of-00002.safetensors", outdir, r, q);
            snprintf(b, sizeof b, "%s/s1-%s-ckr/rank-%05d-of-00002.safetensors", outdir, r, q);
            CHECKF(same_file(a, b), "%s: rank %d's final file differs after a resume at step 1", r, q);
        }
    }
}

/* float8-delayed is not rank-count invariant in the last bits (its first
 * casts use the initial scale 1), so its resume on 1 rank is checked to 1% */
static void test_resume_float8_delayed(void) { resume_exact("float8-delayed", "", true, false); }

/* nf4-qlora with LoRA dropout: its masks are counter-based (seed, step,
 * micro-batch, parameter), so the resumed run draws the same ones */
static void test_resume_nf4_qlora(void)
{
    resume_exact("nf4-qlora", "--pretrain 10 --lora-rank 4 --lora-dropout 0.1 --lr 1e-2", false, true);
}

/* --optim adamw4bit --master bf16-sr (issue 37): the 4-bit moments' codes
 * and scales and the bf16 masters come back bit for bit (the resumed run's
 * stochastic rounding is keyed by seed, parameter, step and global index),
 * also on 1 rank (the blocks move whole); the summary names the measured
 * bytes per parameter */
static void test_resume_low_precision_optim(void)
{
    resume_exact("bf16", "--optim adamw4bit --master bf16-sr", false, true);
    /* FP8-LM's full recipe with its scaled f16 master: the shards' f16
     * codes and block scales come back bit for bit (also on 1 rank) */
    resume_exact("float8-tensorwise", "--optim adamw-fp8 --master f16-scaled", false, true);
    static char out[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe bf16 --optim adamw8bit --ranks 2 --micro 2 --steps 2 " TINY
             " --data '%s' --out '%s/optim8'", corpus, outdir);
    CHECKF(run(args, out, sizeof out) == 0, "adamw8bit: %s", out);
    const char *s = strstr(out, "optimizer adamw8bit, master f32: state ");
    CHECKF(s && atof(s + strlen("optimizer adamw8bit, master f32: state ")) <= 2.05, "no measured bytes: %s", out);
    /* a scaled f16 master with f32 moments: 2 + 4 / 256 bytes per parameter
     * (every param of the bf16 recipe is a dense f32 one) */
    snprintf(args, sizeof args, "train --recipe bf16 --master f16-scaled-sr --ranks 2 --micro 2 --steps 2 " TINY
             " --data '%s' --out '%s/f16m'", corpus, outdir);
    CHECKF(run(args, out, sizeof out) == 0, "f16-scaled-sr: %s", out);
    s = strstr(out, "master f16-scaled-sr: state 8.0000 bytes/param (m + v, f32), masters ");
    CHECKF(s && fabs(atof(strstr(s, "masters ") + 8) - (2 + 4.0 / 256)) < 2e-3, "no scaled-f16 master bytes: %s", out);
    /* --optim-block: torchao's AdamW4bit block of 128 (1 + 8/128 bytes) */
    snprintf(args, sizeof args, "train --recipe bf16 --optim adamw4bit --optim-block 128 --ranks 2 --micro 2 --steps 2 " TINY
             " --data '%s' --out '%s/b128'", corpus, outdir);
    CHECKF(run(args, out, sizeof out) == 0, "--optim-block 128: %s", out);
    s = strstr(out, "optimizer adamw4bit, master f32: state ");
    CHECKF(s && fabs(atof(s + strlen("optimizer adamw4bit, master f32: state ")) - 1.0625) < 3e-3, "block 128: %s", out);
    static const char *const bad[][2] = {{"--optim adam8", "unknown --optim 'adam8'"},
                                         {"--master f16", "unknown --master 'f16'"},
                                         {"--optim-block 100", "--optim-block '100': expected a power of two in 2..256"}};
    for (int k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "train %s --steps 1", bad[k][0]);
        CHECKF(run(args, out, sizeof out) != 0 && strstr(out, bad[k][1]), "%s: %s", bad[k][0], out);
    }
}

/* a float8-delayed checkpoint resumes under bf16: the first loss is within
 * a few % of the float8 run's at that step */
static void test_resume_cross_recipe(void)
{
    static char o1[65536], o2[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --resume '%s/float8-delayed-ck-half' --recipe bf16 --log-exact --log-every 1 "
             "--out '%s/cross'", outdir, outdir);
    int rc = run(args, o2, sizeof o2);
    CHECKF(rc == 0, "float8 -> bf16: exit %d: %s", rc, o2);
    snprintf(args, sizeof args, "train --recipe float8-delayed --ranks 2 --micro 2 --steps 8 " TINY
             " --data '%s' --out '%s/cross-f8'", corpus, outdir);
    CHECK(run(args, o1, sizeof o1) == 0);
    double f8[16], bf[16];
    int n1 = train_losses(o1, "float8-delayed", f8, 16), n2 = train_losses(o2, "bf16", bf, 16);
    CHECKF(n1 >= 8 && n2 >= 4, "%d float8 and %d bf16 losses: %s", n1, n2, o2);
    if (n1 >= 8 && n2 >= 4) {
        CHECKF(fabs(bf[0] - f8[4]) / f8[4] < 0.03, "step 5: bf16 %.4f vs float8 %.4f", bf[0], f8[4]);
        for (int i = 0; i < 4; i++) CHECKF(isfinite(bf[i]) && bf[i] > 0, "bf16 step %d loss %f", i + 5, bf[i]);
    }
    /* nf4-qlora and the dense recipes do not mix */
    snprintf(args, sizeof args, "train --resume '%s/float8-delayed-ck-half' --recipe nf4-qlora --out '%s/cross'", outdir,
             outdir);
    rc = run(args, o2, sizeof o2);
    CHECKF(rc == 2 && strstr(o2, "cannot resume under --recipe nf4-qlora"), "nf4 from float8: %d %s", rc, o2);
}

/* Rewrites checkpoint dir's manifest.json with `key`'s number set to
 * `value` (a top-level or config key; the first occurrence), and with the
 * manifest's own checksum recomputed as lpx writes it (FNV-1a 64 of the
 * file with the 16 digits of "checksum" as zeros) when `resum`. */
static bool edit_manifest(const char *dir, const char *key, const char *value, bool resum)
{
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/index.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)n + 64);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    if (n < 0) {
        free(text);
        return false;
    }
    text[n] = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *k = strstr(text, pat);
    if (!k) {
        free(text);
        return false;
    }
    char *v = k + strlen(pat);
    while (*v == ' ' || *v == '\t') v++;
    char *e = v;
    while (*e && *e != ',' && *e != '\n' && *e != '}') e++;
    char *out = malloc((size_t)n + 64);
    size_t a = (size_t)(v - text);
    memcpy(out, text, a);
    size_t m = a + (size_t)sprintf(out + a, "%s", value);
    strcpy(out + m, e);
    n = (long)strlen(out);
    char *d = strstr(out, "\"checksum\":");
    d = d ? strchr(d + 11, '"') : NULL;
    if (resum && d) {
        memset(d + 1, '0', 16);
        uint64_t h = 0xCBF29CE484222325ull;
        for (long i = 0; i < n; i++) h = (h ^ (unsigned char)out[i]) * 0x100000001B3ull;
        char hx[17];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h);
        memcpy(d + 1, hx, 16);
    }
    f = fopen(path, "wb");
    bool ok = f && fwrite(out, 1, (size_t)n, f) == (size_t)n;
    if (f) fclose(f);
    free(text);
    free(out);
    return ok;
}

/* Resume trusts nothing in the index (the run's record is its user
 * object): an edit without the checksum is
 * refused; with the checksum recomputed, every value still passes the
 * command line's validation (these once crashed or ran garbage: SIGFPE on
 * heads 0 and micro 0, a write past the parameter table at 200 layers,
 * loss 0 at batch 0). One line, exit 2, never a crash. */
static void test_manifest_validated(void)
{
    static char out[65536];
    char args[4096], cmd[4096], dir[600];
    snprintf(dir, sizeof dir, "%s/mf", outdir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/float8-delayed-ck-half' '%s'", dir, outdir, dir);
    CHECK(system(cmd) == 0);
    CHECK(edit_manifest(dir, "micro", "3", false));
    snprintf(args, sizeof args, "train --resume '%s' --out '%s/mfo'", dir, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "the index was edited or damaged") && count_lines(out) == 1, "edited: %d %s", rc,
           out);
    static const char *const cases[][3] = {
        {"heads", "0", "is not divisible by --heads 0"},
        {"micro", "0", "--micro 0: expected an integer in 1..4096"},
        {"batch", "0", "--batch 0: expected an integer in 1..65536"},
        {"ranks", "0", "--ranks 0: expected an integer in 1..64"},
        {"seq", "1", "--seq 1: expected an integer in 2..1048576"},
        {"layers", "200", "parameter b1.norm1 [32] of this run is not in the checkpoint"},
        {"kv_heads", "3", "is not a multiple of --kv-heads 3"},
        {"eval", "0", NULL},   /* optional: 0 keeps the run's */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/float8-delayed-ck-half' '%s'", dir, outdir, dir);
        CHECK(system(cmd) == 0);
        CHECKF(edit_manifest(dir, cases[i][0], cases[i][1], true), "cannot edit %s", cases[i][0]);
        snprintf(args, sizeof args, "train --resume '%s' --steps 7 --sample 0 --out '%s/mfo'", dir, outdir);
        rc = run(args, out, sizeof out);
        if (cases[i][2])
            CHECKF(rc == 2 && strstr(out, cases[i][2]) && count_lines(out) == 1, "%s %s: exit %d: %s", cases[i][0],
                   cases[i][1], rc, out);
        else
            CHECKF(rc == 0, "%s %s: exit %d: %s", cases[i][0], cases[i][1], rc, out);
    }
}

static void test_resume_refusals(void)
{
    static char out[65536];
    char args[4096], cmd[4096];
    const char *ck = "float8-delayed-ck-half";
    /* other model dims: the parameter and both shapes named */
    snprintf(args, sizeof args, "train --resume '%s/%s' --dim 64 --out '%s/ref'", outdir, ck, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "parameter tok_emb is f32 [") && strstr(out, ", 32] in the checkpoint but [") &&
           strstr(out, ", 64] in this run"), "--dim 64: %d %s", rc, out);
    snprintf(args, sizeof args, "train --resume '%s/%s' --layers 2 --out '%s/ref'", outdir, ck, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "parameter b1.norm1 [32] of this run is not in the checkpoint"), "--layers 2: %d %s",
           rc, out);
    snprintf(args, sizeof args, "train --resume '%s/%s' --heads 4 --out '%s/ref'", outdir, ck, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "parameter b0.wk is f32 [32, 32] in the checkpoint but [16, 32] in this run"),
           "--heads 4: %d %s", rc, out);
    /* the same shapes with other heads: the head count itself is refused */
    snprintf(args, sizeof args, "train --resume '%s/%s' --heads 1 --kv-heads 1 --out '%s/ref'", outdir, ck, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "2 attention heads, this run 1"), "--heads 1: %d %s", rc, out);
    snprintf(args, sizeof args, "train --resume '%s/nf4-qlora-ck-half' --lora-rank 8 --out '%s/ref'", outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "adapter b0.wq.lora_a is f32 [4, 32] in the checkpoint but [8, 32] in this run"),
           "--lora-rank 8: %d %s", rc, out);
    /* nothing left to run */
    snprintf(args, sizeof args, "train --resume '%s/%s' --steps 4 --out '%s/ref'", outdir, ck, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "leaves nothing to run"), "--steps 4: %d %s", rc, out);
    /* no manifest: an interrupted save is never taken for a checkpoint */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/part' && cp -r '%s/%s' '%s/part' && rm '%s/part/index.json'", outdir, outdir,
             ck, outdir, outdir);
    CHECK(system(cmd) == 0);
    snprintf(args, sizeof args, "train --resume '%s/part' --out '%s/ref'", outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "no index.json: not a complete lpx train checkpoint") && count_lines(out) == 1,
           "no manifest: %d %s", rc, out);
    /* a damaged file: one byte changed (checksum), or truncated (size) */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/dmg' && cp -r '%s/%s' '%s/dmg' && printf 'x' | dd of='%s/dmg/rank-00001-of-00002.safetensors' "
             "bs=1 seek=2000 conv=notrunc 2>/dev/null", outdir, outdir, ck, outdir, outdir);
    CHECK(system(cmd) == 0);
    snprintf(args, sizeof args, "train --resume '%s/dmg' --out '%s/ref'", outdir, outdir);
    rc = run(args, out, sizeof out);
    /* (found by the ranks as they read: the run stops before its first step) */
    CHECKF(rc != 0 && strstr(out, "rank-00001-of-00002.safetensors has checksum (FNV-1a 64)") && strstr(out, "damaged") &&
           !strstr(out, "step 5"), "one byte changed: %d %s", rc, out);
    snprintf(cmd, sizeof cmd, "truncate -s 1000 '%s/dmg/rank-00000-of-00002.safetensors'", outdir);
    CHECK(system(cmd) == 0);
    rc = run(args, out, sizeof out);
    CHECKF(rc != 0 && strstr(out, "rank-00000-of-00002.safetensors has 1000 bytes, the index says"), "truncated: %d %s",
           rc, out);
    snprintf(args, sizeof args, "train --resume '%s/nosuch' --out '%s/ref'", outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "no such checkpoint directory"), "missing dir: %d %s", rc, out);

    /* --save never replaces a directory that holds other files */
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/user' && touch '%s/user/notes.txt'", outdir, outdir);
    CHECK(system(cmd) == 0);
    snprintf(args, sizeof args, "train --recipe bf16 --ranks 2 --micro 2 --steps 2 " TINY " --data '%s' --out '%s/ref' "
             "--save '%s/user'", corpus, outdir, outdir);
    rc = run(args, out, sizeof out);
    /* refused before step 1 (it was refused only at the end of the run) */
    CHECKF(rc == 2 && strstr(out, "exists and is not an lpx checkpoint (it holds 'notes.txt'") &&
           count_lines(out) == 1, "--save over user files: %d %s", rc, out);
    snprintf(cmd, sizeof cmd, "test -f '%s/user/notes.txt'", outdir);
    CHECK(system(cmd) == 0);

    /* --save-every: each save replaces the last one atomically; nothing
     * temporary is left, and the manifest records the last step */
    snprintf(args, sizeof args, "train --recipe bf16 --ranks 2 --micro 2 --steps 5 --save-every 2 " TINY
             " --data '%s' --out '%s/ref' --save '%s/every'", corpus, outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "checkpoint ") && strstr(out, "every: step 2") && strstr(out, "every: step 4") &&
           strstr(out, "every: step 5"), "--save-every: %d %s", rc, out);
    snprintf(cmd, sizeof cmd, "ls -d '%s'/every.* 2>/dev/null | grep -q . && exit 1; grep -q '\"step\":.5,' "
             "'%s/every/index.json'", outdir, outdir);
    CHECKF(system(cmd) == 0, "--save-every left temporary directories or a wrong step");

    /* option errors */
    static const char *const cases[][2] = {
        {"train --save-every 2", "--save-every needs --save DIR"},
        {"train --steps 5 --stop-after 6", "--stop-after 6 is beyond --steps 5"},
        {"train --compare --save x", "--compare runs two recipes"},
        {"train --inject-nan x", "--inject-nan 'x': expected STEP[:PARAM]"},
        {"train --inject-comm-fault 3", "expected STEP:RANK"},
        {"train --lora-dropout 1", "--lora-dropout '1'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rc = run(cases[i][0], out, sizeof out);
        CHECKF(rc == 2 && strstr(out, cases[i][1]) && count_lines(out) == 1, "'%s': %d %s", cases[i][0], rc, out);
    }
}

/* ---- numerics guards ---- */

static void test_nonfinite(void)
{
    static char out[65536];
    char args[4096];
    /* default: stop with the step, the parameter, the rank and the counts */
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 5 --inject-nan 3 " TINY
             " --data '%s' --out '%s/nan'", corpus, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "lpx train: step 3: non-finite gradient in parameter b0.wq (rank 0): 1 NaN, 1 inf"),
           "stop: %d %s", rc, out);
    CHECKF(!strstr(out, "step    3/5"), "a progress line for the failed step: %s", out);
    /* --skip-nonfinite: the step is skipped, reported and counted */
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 5 --inject-nan 3 "
             "--skip-nonfinite " TINY " --data '%s' --out '%s/nan'", corpus, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "step 3: non-finite gradient in parameter b0.wq (rank 0): 1 NaN, 1 inf; optimizer "
                                  "step skipped (--skip-nonfinite)") &&
           strstr(out, "skipped for non-finite gradients (--skip-nonfinite): 1"), "skip: %d %s", rc, out);
    double l[16];
    int n = train_losses(out, "float8-tensorwise", l, 16);
    CHECKF(n >= 5, "%d losses", n);
    for (int i = 0; i < n && i < 5; i++) CHECKF(isfinite(l[i]), "step %d loss %f after a skipped step", i + 1, l[i]);
    /* under nf4-qlora the grads are the adapters' */
    snprintf(args, sizeof args, "train --recipe nf4-qlora --pretrain 2 --ranks 2 --micro 2 --steps 3 --inject-nan "
             "2:b0.w2.lora_b " TINY " --data '%s' --out '%s/nan'", corpus, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "step 2: non-finite gradient in parameter b0.w2.lora_b (rank 0): 1 NaN, 1 inf"),
           "nf4: %d %s", rc, out);
    /* a non-finite loss is an error with its step, never printed silently */
    snprintf(args, sizeof args, "train --recipe bf16 --ranks 2 --micro 2 --steps 3 --inject-nan 2:loss " TINY
             " --data '%s' --out '%s/nan'", corpus, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "step 2: non-finite loss (nan) in micro-batch 0 (rank 0)") && !strstr(out, "loss nan"),
           "loss: %d %s", rc, out);
    snprintf(args, sizeof args, "train --recipe bf16 --steps 3 --inject-nan 2:nosuch " TINY " --data '%s' --out '%s/nan'",
             corpus, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--inject-nan: no parameter 'nosuch'"), "bad param: %d %s", rc, out);
}

/* a failing rank: every rank stops (no hang), exit 1, and the message
 * names the step, the reporting rank, the collective and the failed rank */
static void test_comm_fault(void)
{
    static char out[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 4 --micro 4 --steps 5 --inject-comm-fault 3:2 "
             TINY " --data '%s' --out '%s/fault'", corpus, outdir);
    time_t t0 = time(NULL);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 1, "comm fault: exit %d: %s", rc, out);
    CHECKF(strstr(out, "lpx train: step 3, rank 0: ") && strstr(out, "(rank 0 of 4, local)") &&
           strstr(out, "rank 2 aborted: injected fault (--inject-comm-fault 3:2)"), "comm fault: %s", out);
    CHECKF(time(NULL) - t0 < 60, "comm fault took %ld s", (long)(time(NULL) - t0));
    rc = run("train --ranks 2 --micro 2 --inject-comm-fault 3:5", out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--inject-comm-fault 3:5: there are 2 ranks"), "rank out of range: %d %s", rc, out);
}

/* mpirun -np 2 lpx train --comm mpi: one rank per process, losses reduced
 * through the comm; the MPI backend reduces bit-identically to the local
 * one, so metrics.csv's losses equal those of --ranks 2 on threads. */
static const char *mpirun;

static bool is_open_mpi(void)
{
    char cmd[1024], line[256] = "";
    snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", mpirun);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    bool ompi = false;
    while (fgets(line, sizeof line, p)) ompi |= strstr(line, "Open MPI") != NULL || strstr(line, "OpenRTE") != NULL;
    pclose(p);
    return ompi;
}

static void test_mpi_same_losses(void)
{
    static char lo[65536], mo[65536];
    char args[4096], cmd[8192];
    /* containers run as root; 2 ranks on fewer cores need oversubscription */
    const char *flags = is_open_mpi() ? "--allow-run-as-root --oversubscribe --bind-to none --timeout 300" : "";
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    const char *recipes[] = {"bf16", "float8-tensorwise"};
    for (int r = 0; r < 2; r++) {
        snprintf(args, sizeof args, "train --recipe %s --ranks 2 --micro 2 --steps 6 " TINY " --data '%s' --out '%s/l%d'",
                 recipes[r], corpus, outdir, r);
        CHECK(run(args, lo, sizeof lo) == 0);
        /* the plugin is found next to the executable (build tree) */
        snprintf(cmd, sizeof cmd, "'%s' %s -np 2 '%s' train --comm mpi --recipe %s --micro 2 --steps 6 " TINY
                 " --data '%s' --out '%s/m%d' 2>&1", mpirun, flags, exe, recipes[r], corpus, outdir, r);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(mo, 1, sizeof mo - 1, p) : 0;
        mo[n] = 0;
        int st = p ? pclose(p) : -1;
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s over mpi: %s", recipes[r], mo);
        CHECKF(strstr(mo, "on 2 mpi ranks") != NULL, "%s over mpi: %s", recipes[r], mo);
        double a[16], b[16];
        int na = train_losses(lo, recipes[r], a, 16), nb = train_losses(mo, recipes[r], b, 16);
        /* only rank 0 prints: one progress line per step */
        CHECKF(na == 6 && nb == 6, "%s: %d local and %d mpi losses", recipes[r], na, nb);
        for (int i = 0; i < na && i < nb; i++)
            CHECKF(a[i] == b[i], "%s step %d: local %.6f mpi %.6f", recipes[r], i + 1, a[i], b[i]);
        double vl = val_of(lo, recipes[r]), vm = val_of(mo, recipes[r]);
        CHECKF(vl > 0 && vl == vm, "%s val: local %.4f mpi %.4f", recipes[r], vl, vm);
        /* the CSVs (6 decimals): train and val losses of every step exactly */
        snprintf(cmd, sizeof cmd, "cut -d, -f1-4 '%s/l%d/metrics.csv' > '%s/l%d.cut' && cut -d, -f1-4 '%s/m%d/metrics.csv' > "
                 "'%s/m%d.cut' && cmp -s '%s/l%d.cut' '%s/m%d.cut'", outdir, r, outdir, r, outdir, r, outdir, r, outdir, r,
                 outdir, r);
        CHECKF(system(cmd) == 0, "%s: metrics.csv losses differ between --comm local --ranks 2 and mpi -np 2", recipes[r]);
    }
    /* --ranks must equal the world size */
    snprintf(cmd, sizeof cmd, "'%s' %s -np 2 '%s' train --comm mpi --ranks 4 " TINY " --data '%s' --out '%s/mx' 2>&1",
             mpirun, flags, exe, corpus, outdir);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(mo, 1, sizeof mo - 1, p) : 0;
    mo[n] = 0;
    int st = p ? pclose(p) : -1;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) != 0, "--ranks 4 on 2 processes exited 0: %s", mo);
    CHECKF(strstr(mo, "--ranks 4 but the MPI world has 2 processes") != NULL, "--ranks 4 on 2 processes: %s", mo);
}

/* Checkpoints over MPI, one rank per process, for a recipe with each kind
 * of state (f32 masters, float8_weight masters, an NF4 base, float8-delayed
 * histories): saved by 2 processes, re-saved by 3 (no step: each process
 * reads its new rows), re-saved by 2 local ranks: the files of the run
 * saved on 2 local ranks, byte for byte; and a resume on 3 processes
 * trains on. */
static void test_mpi_checkpoints(void)
{
    static char out[65536];
    char cmd[8192], args[4096], a[600], b[600];
    const char *flags = is_open_mpi() ? "--allow-run-as-root --oversubscribe --bind-to none --timeout 300" : "";
    const char *common = "--dim 32 --layers 1 --heads 2 --seq 16 --batch 12 --micro 6 --steps 5 --eval 2 --sample 0";
    static const char *const recipes[] = {"bf16", "float8-tensorwise", "float8-delayed", "nf4-qlora"};
    for (size_t i = 0; i < sizeof recipes / sizeof *recipes; i++) {
        const char *r = recipes[i];
        const char *extra = !strcmp(r, "nf4-qlora") ? "--pretrain 3 --lora-rank 4" : "";
        snprintf(args, sizeof args, "train --recipe %s %s %s --ranks 2 --stop-after 3 --data '%s' --out '%s/ml-%s' "
                 "--save '%s/ml-%s-ck'", r, extra, common, corpus, outdir, r, outdir, r);
        CHECKF(run(args, out, sizeof out) == 0, "%s local: %s", r, out);
        /* 2 processes save, 3 processes re-save, 3 processes train on */
        snprintf(cmd, sizeof cmd, "'%s' %s -np 2 '%s' train --comm mpi --recipe %s %s %s --stop-after 3 --data '%s' "
                 "--out '%s/mm-%s' --save '%s/mm-%s-2' 2>&1 && '%s' %s -np 3 '%s' train --comm mpi --resume '%s/mm-%s-2' "
                 "--ranks 3 --stop-after 3 --out '%s/mm-%s' --save '%s/mm-%s-3' 2>&1 && '%s' %s -np 3 '%s' train --comm mpi "
                 "--resume '%s/mm-%s-2' --ranks 3 --out '%s/mm-%s' 2>&1",
                 mpirun, flags, exe, r, extra, common, corpus, outdir, r, outdir, r, mpirun, flags, exe, outdir, r, outdir,
                 r, outdir, r, mpirun, flags, exe, outdir, r, outdir, r);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        int st = p ? pclose(p) : -1;
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strstr(out, "steps 4..5"), "%s over mpi: %s", r, out);
        snprintf(args, sizeof args, "train --resume '%s/mm-%s-3' --ranks 2 --stop-after 3 --out '%s/ml-%s' --save "
                 "'%s/mm-%s-back'", outdir, r, outdir, r, outdir, r);
        CHECKF(run(args, out, sizeof out) == 0, "%s back on 2 local ranks: %s", r, out);
        for (int k = 0; k < 2; k++) {
            snprintf(a, sizeof a, "%s/ml-%s-ck/rank-%05d-of-00002.safetensors", outdir, r, k);
            snprintf(b, sizeof b, "%s/mm-%s-back/rank-%05d-of-00002.safetensors", outdir, r, k);
            CHECKF(same_file(a, b), "%s: rank %d's file after mpi 2 -> mpi 3 -> local 2 differs from the local save", r, k);
        }
    }
}

/* lpx mem's numbers on a grouped-query model, worked by hand:
 *   --dim 128 --layers 2 --heads 4 --kv-heads 1 --ffn 256 --vocab 256
 *   --seq 64 --recipe bf16 --ranks 1,2 (bf16 activations, 1 sequence)
 * D 128, head dim 32, KV = 1 x 32, F 256, V 256, bt = 64 rows.
 * A block: norms 2 x 128, wq and wo 2 x 128^2 = 32768, wk and wv
 *   2 x 32 x 128 = 8192, w1, w3, w2 3 x 256 x 128 = 98304: 139520.
 * Model: 2 x 139520 + embedding 32768 + head 32768 + final norm 128
 *   = 344704 params (4 kv heads would give 393856).
 * 1 rank: params 4 x 344704 = 1378816 B (1.31 MiB); AdamW 8 x = 2757632
 *   (2.63 MiB); grads: the master's 1378816 + the largest group's full
 *   f32 grads (a block, 4 x 139520 = 558080) = 1936896 (1.85 MiB);
 *   unsharded: two adjacent blocks in bf16, 2 x 2 x 139520 = 558080
 *   (545.00 KiB); activations (bf16): per block 2 x 64 x (6 D + 2 KV +
 *   3 F = 1600) + 4 x (2 x 64 + 4 heads x 64) = 206336, x 2 + the head's
 *   2 x 3 x 64 x 128 + 4 x 64 = 49408: 462080 (451.25 KiB); loss chunk
 *   (all 64 rows): 2 x 64 x 256 x 2 + the head's grad V D x (2 + 4)
 *   = 65536 + 196608 = 262144 (256.00 KiB); device total 7355648
 *   (7.01 MiB).
 * 2 ranks (every row count even): params 689408 (673.25 KiB), grads
 *   689408 + 558080 = 1247488 (1.19 MiB), AdamW 1378816 (1.31 MiB), the
 *   rest unchanged: total 4598016 (4.39 MiB).
 * CPU process (tr_mem_overhead: 8 MiB + 0.85 x activations + 0.19 x the
 *   master shard, per rank; plus the f32 initial weights 4 x 344704 =
 *   1378816): 1 rank 7355648 + 1378816 + 8388608 + 392768 + 261975.04 =
 *   17777815 (16.95 MiB); 2 ranks 2 x 4598016 + 1378816 + 8388608 +
 *   2 x (392768 + 130987.52) = 20010967 (19.08 MiB). */
static void test_mem_gqa_numbers(void)
{
    static char out[8192];
    int rc = run("mem --dim 128 --layers 2 --heads 4 --kv-heads 1 --ffn 256 --vocab 256 --seq 64 --recipe bf16 "
                 "--ranks 1,2", out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "(kv 1)") && strstr(out, ": 344704 params"), "%d: %s", rc, out);
    static const char *const rows[][3] = {
        {"params", "1.31 MiB", "673.25 KiB"},     {"grads", "1.85 MiB", "1.19 MiB"},
        {"optimizer", "2.63 MiB", "1.31 MiB"},    {"unsharded", "545.00 KiB", "545.00 KiB"},
        {"activations", "451.25 KiB", "451.25 KiB"}, {"loss chunk", "256.00 KiB", "256.00 KiB"},
        {"device total", "7.01 MiB", "4.39 MiB"},   {"CPU process", "16.95 MiB", "19.08 MiB"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        char want[128];
        snprintf(want, sizeof want, "\n  %-14s %12s %12s\n", rows[i][0], rows[i][1], rows[i][2]);
        CHECKF(strstr(out, want) != NULL, "row '%s': want %s / %s in\n%s", rows[i][0], rows[i][1], rows[i][2], out);
    }
    /* --params N: the shape it picks has about N parameters (within 5%:
     * dims step by 128 per layer), and the count printed is the shape's,
     * recomputed here from the printed dims: vocab x dim x 2 + dim +
     * layers x (2 dim + 2 dim^2 + 2 dim kv + 3 dim ffn), kv = kv heads x
     * (dim / heads) */
    static const double ns[] = {1e8, 1e9, 7e9};
    for (int i = 0; i < 3; i++) {
        char args[64];
        snprintf(args, sizeof args, "mem --params %g", ns[i]);
        rc = run(args, out, sizeof out);
        int d = 0, l = 0, h = 0, kv = 0, f = 0, v = 0, sq = 0;
        long long n = 0;
        int got = sscanf(out, "model: dim %d, layers %d, heads %d (kv %d), ffn %d, vocab %d, seq %d: %lld params", &d, &l,
                         &h, &kv, &f, &v, &sq, &n);
        CHECKF(rc == 0 && got == 8, "--params %g: %d fields of %s", ns[i], got, out);
        if (got != 8) continue;
        double hd = (double)(d / h), want = (double)v * d * 2 + d + (double)l * (2.0 * d + 2.0 * d * d + 2.0 * d * kv * hd +
                                                                                 3.0 * d * f);
        CHECKF((double)n == want, "--params %g: %lld params printed, the shape has %.0f", ns[i], n, want);
        CHECKF(fabs((double)n - ns[i]) <= 0.05 * ns[i], "--params %g picked %lld params", ns[i], n);
    }
}

/* the value of "  LABEL  estimate X MiB" (the summary's per-phase process
 * estimate), bytes; NAN when absent */
static double phase_estimate(const char *out, const char *label)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %-20s estimate ", label);
    const char *s = strstr(out, pat);
    return s ? strtod(s + strlen(pat), NULL) * 1048576.0 : NAN;
}

/* "X MiB" or "X GiB" (or KiB) at s, bytes */
static double parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    while (*end == ' ') end++;
    return v * (!strncmp(end, "GiB", 3) ? 1073741824.0 : !strncmp(end, "MiB", 3) ? 1048576.0
                : !strncmp(end, "KiB", 3) ? 1024.0 : 1.0);
}

/* The memory guard checks every phase a run goes through: nf4-qlora's
 * bf16 pre-training (larger than the adapter training: full AdamW state)
 * and --compare's bf16 run (larger than float8-tensorwise's: bf16 wire
 * weights), not only the recipe's. With LPX_TEST_MEM_AVAILABLE between the
 * two phases' estimates (read from a run's summary) the run is refused
 * naming the larger phase (before: accepted, then the phase took the
 * memory); just above the larger one it is accepted. */
static void test_mem_guard_phases(void)
{
    static char out[65536];
    static const struct { const char *args, *main, *big; } cases[] = {
        {"--recipe nf4-qlora --pretrain 2", "nf4-qlora", "bf16-pretrain"},
        {"--recipe float8-tensorwise --compare", "float8-tensorwise", "bf16"},
    };
    for (int k = 0; k < 2; k++) {
        char args[4096], avail[64];
        snprintf(args, sizeof args, "train %s --ranks 1 --micro 1 --steps 2 --dim 256 --layers 2 --heads 4 --seq 16 "
                 "--batch 4 --eval 1 --sample 0 --data '%s' --out '%s/guard'", cases[k].args, corpus, outdir);
        CHECKF(run(args, out, sizeof out) == 0, "%s: %s", cases[k].args, out);
        double small = phase_estimate(out, cases[k].main), big = phase_estimate(out, cases[k].big);
        CHECKF(big > small + 0.5 * 1048576, "%s: phases %s %.0f, %s %.0f bytes", cases[k].args, cases[k].main, small,
               cases[k].big, big);
        if (!(big > small + 0.5 * 1048576)) continue;
        snprintf(avail, sizeof avail, "%.0f", (small + big) / 2);
        setenv("LPX_TEST_MEM_AVAILABLE", avail, 1);
        int rc = run(args, out, sizeof out);
        char want[64];
        snprintf(want, sizeof want, "in its %s phase", cases[k].big);
        CHECKF(rc == 2 && strstr(out, want) && strstr(out, "LPX_TEST_MEM_AVAILABLE") && count_lines(out) == 1,
               "%s with %s bytes available: exit %d: %s", cases[k].args, avail, rc, out);
        snprintf(avail, sizeof avail, "%.0f", big + 1048576);
        setenv("LPX_TEST_MEM_AVAILABLE", avail, 1);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 0, "%s with %s bytes available: exit %d: %s", cases[k].args, avail, rc, out);
        unsetenv("LPX_TEST_MEM_AVAILABLE");
    }
}

/* The guard compares with the memory available, not the machine's total:
 * MemAvailable (a fake /proc/meminfo, LPX_TEST_MEMINFO) and the room under
 * the cgroup's limit (a fake cgroup directory, LPX_TEST_CGROUP: v2
 * memory.max minus memory.current, or v1 memory.limit_in_bytes minus
 * memory.usage_in_bytes; "max" and v1's 2^63 mean no limit), the smaller
 * one, both named in the refusal. The model (dim 1024, 6 layers, 2 ranks:
 * about 1.06 GiB) is refused in every case before anything is allocated. */
static void test_mem_guard_available(void)
{
    static char out[8192];
    char dir[300], args[4096], cmd[1200];
    snprintf(dir, sizeof dir, "%s/fakemem", outdir);
    static const struct { const char *meminfo, *files, *want; } cases[] = {
        /* MemAvailable 0.86 GiB (900000 kB), cgroup v2 1 GiB - 0.5 GiB: 0.5 GiB */
        {"MemTotal:       99999999 kB\nMemFree:   1 kB\nMemAvailable:     900000 kB\n",
         "echo 1073741824 > memory.max; echo 536870912 > memory.current",
         "512.0 MiB available (MemAvailable 878.9 MiB; cgroup memory.max 1.00 GiB minus memory.current 512.0 MiB)"},
        /* v2 "max": no limit, MemAvailable decides */
        {"MemAvailable:     600000 kB\n", "echo max > memory.max; echo 5 > memory.current",
         "585.9 MiB available (MemAvailable 585.9 MiB; no cgroup limit)"},
        /* v1: a 0.75 GiB limit, 0.25 GiB used */
        {"MemAvailable:     900000 kB\n", "echo 805306368 > memory.limit_in_bytes; echo 268435456 > memory.usage_in_bytes",
         "512.0 MiB available (MemAvailable 878.9 MiB; cgroup memory.limit_in_bytes 768.0 MiB minus "
         "memory.usage_in_bytes 256.0 MiB)"},
        /* v1 without a limit (2^63 rounded down to pages) */
        {"MemAvailable:     900000 kB\n", "echo 9223372036854771712 > memory.limit_in_bytes; echo 1 > memory.usage_in_bytes",
         "878.9 MiB available (MemAvailable 878.9 MiB; no cgroup limit)"},
        /* the cgroup's room is smaller than MemAvailable even when usage is past the limit */
        {"MemAvailable:     900000 kB\n", "echo 1000 > memory.max; echo 5000 > memory.current",
         "0.0 MiB available (MemAvailable 878.9 MiB; cgroup memory.max 0.0 MiB minus memory.current 0.0 MiB)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cd '%s' && printf '%%s' '%s' > meminfo && %s", dir, dir,
                 dir, cases[k].meminfo, cases[k].files);
        CHECK(system(cmd) == 0);
        snprintf(cmd, sizeof cmd, "%s/meminfo", dir);
        setenv("LPX_TEST_MEMINFO", cmd, 1);
        setenv("LPX_TEST_CGROUP", dir, 1);
        snprintf(args, sizeof args, "train --recipe bf16 --ranks 2 --micro 2 --batch 4 --steps 1 --dim 1024 --layers 6 "
                 "--heads 8 --seq 128 --data '%s' --out '%s/guard2'", corpus, outdir);
        int rc = run(args, out, sizeof out);
        CHECKF(rc == 2 && strstr(out, cases[k].want) && strstr(out, "in its bf16 phase"), "case %zu: exit %d: %s\nwant: %s",
               k, rc, out, cases[k].want);
    }
    unsetenv("LPX_TEST_MEMINFO");
    unsetenv("LPX_TEST_CGROUP");
}

/* lpx mem's "CPU process" row against the real peak of lpx train's
 * process (VmHWM, printed in the summary) at three sizes, 2 ranks, f32
 * activations (lpx train's on the CPU): within 10% (the measured gaps
 * were under 2%, docs/TRAIN.md). The summary's own process estimate too.
 * Before, the only comparison was the per-category bookkeeping, which is
 * computed like the estimate and cannot disagree; the real peak was 10-30%
 * above it. */
/* sanitizer builds: the process's RSS holds the sanitizer's shadow memory
 * and quarantine, which no estimate of lpx's own memory includes */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TRAIN_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TRAIN_SANITIZED 1
#endif
#endif

static void test_mem_process_peak(void)
{
#ifdef TRAIN_SANITIZED
    printf("  (a sanitizer build: the peak RSS includes its shadow memory; the normal build checks the estimate)\n");
    return;
#endif
    static char out[65536], mem[8192];
    static const char *const sizes[] = {"--dim 256 --layers 4 --heads 4 --seq 64",
                                        "--dim 512 --layers 4 --heads 8 --seq 128",
                                        "--dim 768 --layers 6 --heads 12 --seq 128"};
    for (int k = 0; k < 3; k++) {
        char args[4096];
        snprintf(args, sizeof args, "train --recipe bf16 --ranks 2 --micro 2 --batch 4 --steps 2 --eval 1 --sample 0 %s "
                 "--data '%s' --out '%s/peak'", sizes[k], corpus, outdir);
        int rc = run(args, out, sizeof out);
        CHECKF(rc == 0, "%s: exit %d: %s", sizes[k], rc, out);
        const char *p = strstr(out, "real peak RSS ");
        double peak = p ? strtod(p + strlen("real peak RSS "), NULL) * 1048576.0 : NAN;
        const char *e = p ? strstr(p, "process estimate ") : NULL;
        double est = e ? strtod(e + strlen("process estimate "), NULL) * 1048576.0 : NAN;
        snprintf(args, sizeof args, "mem --recipe bf16 --ranks 2 --batch 2 --act f32 %s", sizes[k]);
        rc = run(args, mem, sizeof mem);
        const char *m = strstr(mem, "\n  CPU process ");
        double cpu = m ? parse_size(m + strlen("\n  CPU process ")) : NAN;
        CHECKF(rc == 0 && peak > 0 && fabs(cpu - peak) <= 0.10 * peak, "%s: lpx mem %.1f MiB, real peak %.1f MiB",
               sizes[k], cpu / 1048576, peak / 1048576);
        CHECKF(fabs(est - peak) <= 0.10 * peak, "%s: lpx train's estimate %.1f MiB, real peak %.1f MiB", sizes[k],
               est / 1048576, peak / 1048576);
        printf("     %s: real peak %.1f MiB, lpx mem %.1f MiB (%+.1f%%)\n", sizes[k], peak / 1048576, cpu / 1048576,
               100 * (cpu - peak) / peak);
    }
}

static void test_mem(void)
{
    char out[4096];
    CHECK(run("mem --params 7e9 --recipe nf4-qlora --ranks 8", out, sizeof out) == 0);
    CHECK(strstr(out, "params") && strstr(out, "activations") && strstr(out, "total"));
    CHECK(run("mem --dim 128 --layers 2 --vocab 94 --ranks 4 --recipe float8-tensorwise", out, sizeof out) == 0);
    /* the estimate lpx train prints next to its measurement is within 10% */
    static char tr[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 2 " TINY
             " --data '%s' --out '%s/mem'", corpus, outdir);
    CHECK(run(args, tr, sizeof tr) == 0);
    const char *s = strstr(tr, "estimate (worst ");
    CHECK(s != NULL);
    if (s) CHECKF(atof(s + strlen("estimate (worst ")) <= 10.0, "estimate off: %s", s);
}

/* --resume under another --ranks, every recipe: a checkpoint saved on 2
 * ranks, re-saved on 3 with no step (--stop-after at its step: each rank
 * reads the rows of its new shards and the float8-delayed slots it runs),
 * then on 2 again, gives the first checkpoint's rank files byte for byte
 * (weights, float8_weight masters, the NF4 base and adapters, AdamW's
 * moments and steps, the delayed histories); and a resume on 3 ranks
 * trains on. */
static void test_resume_other_ranks_every_recipe(void)
{
    static char out[65536];
    static const char *const recipes[] = {"f32", "bf16", "float8-tensorwise", "float8-rowwise", "float8-blockwise",
                                          "float8-delayed", "nf4-qlora", "mxfp8", "mxfp4"};
    const char *common = "--dim 32 --layers 1 --heads 2 --seq 16 --batch 12 --micro 6 --steps 6 --eval 2 --sample 0";
    char args[4096], a[600], b[600];
    int n = 0;
    for (size_t i = 0; i < sizeof recipes / sizeof *recipes; i++) {
        const char *r = recipes[i];
        const char *extra = !strcmp(r, "nf4-qlora") ? "--pretrain 4 --lora-rank 4" : "";
        snprintf(args, sizeof args, "train --recipe %s %s %s --ranks 2 --stop-after 3 --data '%s' --out '%s/rk-%s' "
                 "--save '%s/rk-%s-a'", r, extra, common, corpus, outdir, r, outdir, r);
        int rc = run(args, out, sizeof out);
        if (rc != 0 && strstr(out, "lpx-mx")) {
            printf("     %s: the lpx-mx plugin is not built here; not checked\n", r);
            continue;
        }
        CHECKF(rc == 0, "%s on 2 ranks: exit %d: %s", r, rc, out);
        snprintf(args, sizeof args, "train --resume '%s/rk-%s-a' --ranks 3 --stop-after 3 --out '%s/rk-%s' --save "
                 "'%s/rk-%s-b'", outdir, r, outdir, r, outdir, r);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 0 && strstr(out, "now %s on 3") == NULL && strstr(out, "on 2 ranks; now"), "%s 2 -> 3: exit %d: %s",
               r, rc, out);
        snprintf(args, sizeof args, "train --resume '%s/rk-%s-b' --ranks 2 --stop-after 3 --out '%s/rk-%s' --save "
                 "'%s/rk-%s-c'", outdir, r, outdir, r, outdir, r);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 0 && strstr(out, "on 3 ranks; now"), "%s 3 -> 2: exit %d: %s", r, rc, out);
        for (int k = 0; k < 2; k++) {
            snprintf(a, sizeof a, "%s/rk-%s-a/rank-%05d-of-00002.safetensors", outdir, r, k);
            snprintf(b, sizeof b, "%s/rk-%s-c/rank-%05d-of-00002.safetensors", outdir, r, k);
            CHECKF(same_file(a, b), "%s: rank %d's file differs after 2 -> 3 -> 2 ranks", r, k);
        }
        snprintf(a, sizeof a, "%s/rk-%s-b/rank-00002-of-00003.safetensors", outdir, r);
        CHECKF(access(a, R_OK) == 0, "%s: no third rank file in the 3-rank checkpoint", r);
        /* and it trains on 3 ranks from the 2-rank checkpoint */
        snprintf(args, sizeof args, "train --resume '%s/rk-%s-a' --ranks 3 --out '%s/rk-%s'", outdir, r, outdir, r);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 0 && strstr(out, "steps 4..6"), "%s resumed on 3 ranks: exit %d: %s", r, rc, out);
        n++;
    }
    printf("     %d recipes: 2 -> 3 -> 2 ranks, checkpoints equal byte for byte\n", n);
    CHECK(n >= 7);
}

/* The gathered format lpx train wrote before (version 2, committed under
 * tests/data/train_ckpt_v2: float8-delayed on 2 ranks, step 2 of 4) is
 * still read: a step from it equals, bit for bit, a step from its
 * conversion to the sharded format; --save over it replaces it. */
static void test_resume_gathered_format(void)
{
    static char o1[65536], o2[65536], o3[65536];
    const char *v2 = getenv("LPX_TEST_CKPT_V2");
    if (!v2) SKIP_CASE("LPX_TEST_CKPT_V2 is not set");
    char args[4096], cmd[2048];
    snprintf(args, sizeof args, "train --resume '%s' --data '%s' --stop-after 3 --log-exact --log-every 1 --out '%s/v2a'",
             v2, corpus, outdir);
    int rc = run(args, o1, sizeof o1);
    CHECKF(rc == 0 && strstr(o1, "resuming") && strstr(o1, "at step 2"), "from version 2: exit %d: %s", rc, o1);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/v2copy' && cp -r '%s' '%s/v2copy'", outdir, v2, outdir);
    CHECK(system(cmd) == 0);
    /* converted in place: the version 2 directory is replaced by a sharded one */
    snprintf(args, sizeof args, "train --resume '%s/v2copy' --data '%s' --stop-after 2 --out '%s/v2b' --save '%s/v2copy'",
             outdir, corpus, outdir, outdir);
    rc = run(args, o2, sizeof o2);
    CHECKF(rc == 0, "converting: exit %d: %s", rc, o2);
    snprintf(cmd, sizeof cmd, "test -f '%s/v2copy/index.json' && ! test -e '%s/v2copy/manifest.json' && "
             "! ls -d '%s'/v2copy.* 2>/dev/null | grep -q .", outdir, outdir, outdir);
    CHECKF(system(cmd) == 0, "the version 2 directory was not replaced cleanly");
    snprintf(args, sizeof args, "train --resume '%s/v2copy' --data '%s' --stop-after 3 --log-exact --log-every 1 "
             "--out '%s/v2c'", outdir, corpus, outdir);
    rc = run(args, o3, sizeof o3);
    CHECKF(rc == 0, "from the converted one: exit %d: %s", rc, o3);
    int s1[4], s3[4];
    char h1[4][40], h3[4][40];
    int n1 = hex_losses(o1, "float8-delayed", s1, h1, 4), n3 = hex_losses(o3, "float8-delayed", s3, h3, 4);
    CHECKF(n1 == 1 && n3 == 1 && s1[0] == 3 && s3[0] == 3 && !strcmp(h1[0], h3[0]),
           "step 3 from version 2 (%d: %s) and from its sharded conversion (%d: %s) differ", n1, n1 ? h1[0] : "-", n3,
           n3 ? h3[0] : "-");
}

int main(int argc, char **argv)
{
    bool mpi = argc > 1 && !strcmp(argv[1], "mpi");
    exe = getenv("LPX_TEST_LPX_EXE");
    const char *src = getenv("LPX_TEST_CORPUS");
    if (!exe || !src) {
        printf("LPX_TEST_LPX_EXE / LPX_TEST_CORPUS not set: skipping\n");
        return 77;
    }
    if (mpi) {
        mpirun = getenv("LPX_TEST_MPIRUN");
        const char *plugin = getenv("LPX_TEST_MPI_PLUGIN");
        if (!mpirun || !*mpirun || access(mpirun, X_OK) || !plugin || !*plugin || access(plugin, R_OK)) {
            printf("skip: no mpirun or no lpx-mpi.so (LPX_TEST_MPIRUN, LPX_TEST_MPI_PLUGIN)\n");
            return 77;
        }
    }
    snprintf(corpus, sizeof corpus, "%s", src);
    snprintf(outdir, sizeof outdir, "/tmp/lpx-test-train%s.%ld", mpi ? "-mpi" : "", (long)getpid());
    mkdir(outdir, 0777);
    if (mpi) {
        RUN(test_mpi_same_losses);
        RUN(test_mpi_checkpoints);
    } else {
        RUN(test_bad_options);
        RUN(test_first_loss_every_preset);
        RUN(test_loss_goes_down_and_files);
        RUN(test_engine_stats);
        RUN(test_ranks_same_losses);
        RUN(test_activation_checkpointing);
        RUN(test_bf16_activations);
        RUN(test_loss_chunks);
        RUN(test_mem_blockwise_shards);
        RUN(test_nf4_qlora);
        RUN(test_mem);
        RUN(test_mem_gqa_numbers);
        RUN(test_mem_guard_phases);
        RUN(test_mem_guard_available);
        RUN(test_mem_process_peak);
        RUN(test_resume_float8_delayed);
        RUN(test_resume_at_step_1);
        RUN(test_resume_nf4_qlora);
        RUN(test_resume_low_precision_optim);
        RUN(test_resume_cross_recipe);
        RUN(test_resume_refusals);
        RUN(test_resume_other_ranks_every_recipe);
        RUN(test_resume_gathered_format);
        RUN(test_manifest_validated);
        RUN(test_nonfinite);
        RUN(test_comm_fault);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", outdir);
    /* LPX_TEST_KEEP=1 keeps the runs' files for a look */
    if (!getenv("LPX_TEST_KEEP") && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", outdir);
    return CHECK_DONE();
}
