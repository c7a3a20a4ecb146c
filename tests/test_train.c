/* `lpx train` and `lpx mem` end to end: runs the built lpx executable
 * (LPX_TEST_LPX_EXE) on tiny models (seconds each) and checks exit codes,
 * losses, rank-count invariance, the files it writes and nf4-qlora's
 * frozen base. With the argument `mpi`: `mpirun -np 2 lpx train --comm
 * mpi` against `--ranks 2` on the local comm (LPX_TEST_MPIRUN,
 * LPX_TEST_MPI_PLUGIN; skipped, 77, without either). */
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static const char *exe;
static char corpus[256], outdir[256];

static int run(const char *args, char *buf, size_t len)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(buf, 1, len - 1, p);
    buf[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* tiny model flags shared by the runs */
#define TINY "--dim 32 --layers 1 --heads 2 --seq 16 --batch 4 --eval 2 --sample 40 --log-every 1"

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_bad_options(void)
{
    static const char *const cases[][2] = {
        {"train --recipe nosuch", "unknown recipe 'nosuch'"},
        {"train --ranks 0", "--ranks '0'"},
        {"train --dim 48", "not a multiple of 32"},
        {"train --dim 64 --heads 3", "not divisible by --heads"},
        {"train --ranks 3", "not divisible by --ranks 3"},
        {"train --batch 6", "not divisible by --micro"},
        {"train --comm nccl", "--comm nccl is not available"},
        {"train --device cuda", "--device cuda"},
        {"train --wrap nope", "unknown --wrap"},
        {"train --steps", "needs a value"},
        {"train --bogus 1", "unknown option '--bogus'"},
        {"train --init x.bin", "--init is for --recipe nf4-qlora"},
        {"mem --recipe nosuch", "unknown recipe"},
        {"mem", "give --params"},
    };
    char out[4096];
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
    CHECK(run("train --help", out, sizeof out) == 0 && strstr(out, "--recipe"));
}

/* losses of the progress lines "step N/M  loss X" in order */
static int losses(const char *out, const char *label, double *v, int cap)
{
    int n = 0;
    const char *s = out;
    char pat[64];
    snprintf(pat, sizeof pat, "  %s ", label);
    while ((s = strstr(s, pat)) && n < cap) {
        const char *l = strstr(s, "loss ");
        if (!l) break;
        v[n++] = atof(l + 5);
        s = l;
    }
    return n;
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

static void test_loss_goes_down_and_files(void)
{
    static char out[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe float8-tensorwise --ranks 2 --micro 2 --steps 30 --lr 1e-2 "
             TINY " --compare --data '%s' --out '%s/run'", corpus, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "train exited %d: %s", rc, out);
    double l[64];
    int n = losses(out, "float8-tensorwise", l, 64);
    CHECKF(n >= 30, "%d progress lines", n);
    if (n >= 30) CHECKF(l[n - 1] < l[0] - 0.5, "loss %.3f -> %.3f", l[0], l[n - 1]);
    double v8 = val_of(out, "float8-tensorwise"), vb = val_of(out, "bf16");
    CHECKF(v8 > 0 && vb > 0 && fabs(v8 - vb) / vb < 0.05, "val float8 %.4f bf16 %.4f", v8, vb);
    CHECK(strstr(out, "amax all-reduces per step: 1") != NULL);
    CHECK(strstr(out, "no fallbacks") != NULL);
    CHECK(strstr(out, "sample (") != NULL);

    /* metrics.csv: header, 30 rows per recipe, val on the last row, complete marker */
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
        CHECK(rows == 60 && f8 == 30 && bf == 30 && complete);
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
        CHECKF(ratio > 0.3 && ratio <= 0.55, "fp8 / bf16 all-gather bytes %.3f", ratio);
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
        int na = losses(o1, recipes[r], a, 16), nb = losses(o2, recipes[r], b, 16);
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

static void test_nf4_qlora(void)
{
    static char out[65536];
    char args[4096];
    snprintf(args, sizeof args, "train --recipe nf4-qlora --ranks 2 --micro 2 --steps 12 --pretrain 20 --lr 1e-2 "
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
    /* the base checkpoint can be given back with --init */
    snprintf(args, sizeof args, "train --recipe nf4-qlora --ranks 1 --micro 2 --steps 3 " TINY
             " --dim 64 --lora-rank 4 --init '%s/nf4/model.bin' --data '%s' --out '%s/nf4b'", outdir, corpus, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "nf4 --init exited %d: %s", rc, out);
    snprintf(args, sizeof args, "train --recipe nf4-qlora --steps 3 " TINY " --init '%s/nf4/model.bin' --data '%s' --out '%s/nf4c'",
             outdir, corpus, outdir);
    CHECK(run(args, out, sizeof out) == 1 && strstr(out, "has vocab"));
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
        int na = losses(lo, recipes[r], a, 16), nb = losses(mo, recipes[r], b, 16);
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
    } else {
        RUN(test_bad_options);
        RUN(test_loss_goes_down_and_files);
        RUN(test_engine_stats);
        RUN(test_ranks_same_losses);
        RUN(test_nf4_qlora);
        RUN(test_mem);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", outdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", outdir);
    return CHECK_DONE();
}
