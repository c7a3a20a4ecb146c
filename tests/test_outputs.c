/* Output paths of the `lpx` command (issue "Nothing lost";
 * docs/RELIABILITY.md): end to end on the built executable, in a scratch
 * folder.
 *   - eval --logits at a FIFO is refused before the run (the FIFO stays a
 *     FIFO; the old code renamed a file over it), at a symbolic link the
 *     link's target is written and the link stays a link;
 *   - eval --logits A --grads /missing/x: refused before the run, A not
 *     written, and the message is the cause alone (no "lpx_local_run:
 *     rank 0:" wrapping);
 *   - train --save DIR/ (trailing slash) saves DIR, nothing inside it; a
 *     --save with a missing parent, a --save-hf or --out that is a FIFO or
 *     holds a FIFO where a file goes, refused before step 1 (exit 2);
 *   - train --save over the user's folder that holds an index.json, and
 *     through a symbolic link: refused, every file kept. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "run_util.h"

static char outdir[256], fixture[512], corpus[512];

#define TINY "--dim 32 --layers 1 --heads 2 --seq 16 --batch 4 --micro 2 --ranks 2 --eval 2 --sample 0 --steps 2"

static int sh(const char *cmd)
{
    char c[4096];
    snprintf(c, sizeof c, "cd '%s' && %s", outdir, cmd);
    return system(c);
}

static bool is_fifo(const char *p)
{
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode);
}

static void test_eval_outputs(void)
{
    char args[4096], out[8192], p[600], q[600];
    /* a FIFO: refused at once (no reader is there: an open would block) */
    snprintf(p, sizeof p, "%s/fifo", outdir);
    CHECK(mkfifo(p, 0644) == 0);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s'", fixture, fixture, p);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "is a FIFO") && count_lines(out) == 1, "--logits FIFO: %d %s", rc, out);
    CHECKF(is_fifo(p), "the FIFO was replaced");

    /* a link: its target written, the link kept */
    CHECK(sh("echo old > target.safetensors && ln -s target.safetensors link.safetensors") == 0);
    snprintf(p, sizeof p, "%s/link.safetensors", outdir);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s'", fixture, fixture, p);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "--logits through a link: %d %s", rc, out);
    struct stat sb;
    CHECKF(lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced by a file");
    snprintf(q, sizeof q, "%s/target.safetensors", outdir);
    CHECKF(stat(q, &sb) == 0 && sb.st_size > 1000, "the link's target was not written (%lld bytes)",
           (long long)sb.st_size);

    /* --grads unwritable: nothing written, the cause in one line */
    snprintf(p, sizeof p, "%s/a.safetensors", outdir);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s' --grads '%s/no/such/g'",
             fixture, fixture, p, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--grads") && strstr(out, "does not exist") && !strstr(out, "lpx_local_run") &&
           count_lines(out) == 1, "--grads in a missing folder: %d %s", rc, out);
    CHECKF(access(p, F_OK) != 0, "--logits was written although --grads could not be");
}

static void test_train_outputs(void)
{
    char args[4096], out[16384], p[700];
    /* a trailing slash names the directory itself */
    snprintf(args, sizeof args, "train --recipe bf16 " TINY " --data '%s' --out '%s/o' --save '%s/ck/'", corpus, outdir,
             outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "--save ck/: %d %s", rc, out);
    snprintf(p, sizeof p, "%s/ck/index.json", outdir);
    CHECKF(access(p, F_OK) == 0, "--save ck/ wrote no ck/index.json");
    snprintf(p, sizeof p, "%s/ck/.tmp", outdir);
    CHECKF(access(p, F_OK) != 0, "--save ck/ made ck/.tmp inside the checkpoint");
    rc = run(args, out, sizeof out);   /* and replaces it */
    CHECKF(rc == 0, "a second --save ck/: %d %s", rc, out);

    /* refused before step 1: a missing parent, FIFOs where files go */
    struct {
        const char *opt, *needle;
    } bad[] = {
        {"--save '%s/no/such/ck'", "does not exist"},
        {"--save-hf '%s/fifo'", "is not a directory"},
        {"--out '%s/fifo'", "is not a directory"},
        {"--out '%s/withfifo'", "is a FIFO"},
        {"--save-hf '%s/withfifo2'", "is a FIFO"},
    };
    CHECK(sh("mkfifo fifo2 && mkdir withfifo withfifo2 && mkfifo withfifo/metrics.csv && "
             "mkfifo withfifo2/model.safetensors") == 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char opt[700];
        snprintf(opt, sizeof opt, bad[i].opt, outdir);
        snprintf(args, sizeof args, "train --recipe bf16 " TINY " --data '%s' --out '%s/o2' %s", corpus, outdir,
                 strstr(bad[i].opt, "--out") ? "" : opt);
        if (strstr(bad[i].opt, "--out"))
            snprintf(args, sizeof args, "train --recipe bf16 " TINY " --data '%s' %s", corpus, opt);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 2 && strstr(out, bad[i].needle) && !strstr(out, "step 1") && count_lines(out) == 1,
               "%s: %d %s", opt, rc, out);
    }
    snprintf(p, sizeof p, "%s/withfifo/metrics.csv", outdir);
    CHECKF(is_fifo(p), "the FIFO in --out was replaced");

    /* the user's folder with an index.json, and a link to a folder */
    CHECK(sh("mkdir mine && echo '{}' > mine/index.json && echo keep > mine/notes.txt && "
             "mkdir tgt && echo keep > tgt/notes.txt && ln -s tgt lnk") == 0);
    const char *dirs[2] = {"mine", "lnk"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "train --recipe bf16 " TINY " --data '%s' --out '%s/o' --save '%s/%s'", corpus,
                 outdir, outdir, dirs[i]);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 2 && count_lines(out) == 1 && !strstr(out, "step 1"), "--save %s: %d %s", dirs[i], rc, out);
    }
    CHECK(sh("test -f mine/notes.txt && test -f mine/index.json && test -f tgt/notes.txt && test -L lnk") == 0);
}

/* What an adversarial review found after the first fixes: two spellings
 * of one output, an output that is an input, two options naming one
 * folder, a folder that access() calls writable but takes no file, a
 * device as the corpus, "ck/." as a save path. */
static void test_outputs_that_clash(void)
{
    static char out[1 << 16];
    char args[4096], p[700];
    /* --logits and --grads, one file in two spellings */
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s/same.st' --grads '%s/./same.st'",
             fixture, fixture, outdir, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "name one file") && count_lines(out) == 1, "two spellings: %d %s", rc, out);
    /* an output that is an input: refused, the input untouched */
    snprintf(args, sizeof args, "cp -r '%s' '%s/fx' && cp '%s/fx/tokens.bin' '%s/tokens.copy'", fixture, outdir, outdir,
             outdir);
    CHECK(system(args) == 0);
    snprintf(args, sizeof args, "eval --init '%s/fx' --tokens '%s/fx/tokens.bin' --logits '%s/fx/tokens.bin'", outdir,
             outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "is the input") && count_lines(out) == 1, "--logits = --tokens: %d %s", rc, out);
    snprintf(args, sizeof args, "eval --init '%s/fx' --tokens '%s/fx/tokens.bin' --logits "
             "'%s/fx/model-00001-of-00002.safetensors'", outdir, outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "is the input"), "--logits = a shard of --init: %d %s", rc, out);
    snprintf(args, sizeof args, "cmp -s '%s/fx/tokens.bin' '%s/tokens.copy'", outdir, outdir);
    CHECKF(system(args) == 0, "the tokens file was changed");
    /* --save with --out or --save-hf on one folder; --save-hf into --init */
    struct {
        const char *opts, *needle;
    } clash[] = {
        {"--save '%s/one' --out '%s/one'", "--save and --out name one directory"},
        {"--save '%s/two' --save-hf '%s/two'", "--save and --save-hf name one directory"},
    };
    for (size_t i = 0; i < sizeof clash / sizeof *clash; i++) {
        char o[1400];
        snprintf(o, sizeof o, clash[i].opts, outdir, outdir);
        snprintf(args, sizeof args, "train --recipe bf16 " TINY " --data '%s' %s", corpus, o);
        rc = run(args, out, sizeof out);
        CHECKF(rc == 2 && strstr(out, clash[i].needle) && !strstr(out, "step 1") && count_lines(out) == 1, "%s: %d %s",
               o, rc, out);
    }
    snprintf(args, sizeof args, "train --recipe bf16 --init '%s/fx' --steps 1 --seq 16 --batch 4 --micro 2 --ranks 2 "
             "--eval 1 --sample 0 --data '%s' --out '%s/o3' --save-hf '%s/fx/'", outdir, corpus, outdir, outdir);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "--save-hf names the --init folder") && count_lines(out) == 1,
           "--save-hf into --init: %d %s", rc, out);
    snprintf(p, sizeof p, "%s/fx/model-00001-of-00002.safetensors", outdir);
    CHECKF(access(p, F_OK) == 0, "the --init model lost a shard");
    /* a folder that access() calls writable but takes no file (/proc/self
     * answers yes to root): refused before the run, nothing written */
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s/l.st' --grads /proc/self/g.st",
             fixture, fixture, outdir);
    rc = run(args, out, sizeof out);
    snprintf(p, sizeof p, "%s/l.st", outdir);
    CHECKF(rc == 2 && strstr(out, "--grads") && access(p, F_OK) != 0, "--grads in /proc/self: %d %s", rc, out);
    /* a device as the corpus: refused at once (it never ends) */
    rc = run("train --data /dev/zero --steps 1", out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "is a device"), "--data /dev/zero: %d %s", rc, out);
    /* "ck/." is "ck"; "." is refused */
    snprintf(args, sizeof args, "train --recipe bf16 " TINY " --data '%s' --out '%s/o4' --save '%s/dot/.'", corpus,
             outdir, outdir);
    rc = run(args, out, sizeof out);
    snprintf(p, sizeof p, "%s/dot/index.json", outdir);
    CHECKF(rc == 0 && access(p, F_OK) == 0, "--save dot/.: %d %s", rc, out);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "a second --save dot/.: %d %s", rc, out);
    snprintf(p, sizeof p, "%s/dot/..tmp", outdir);
    CHECKF(access(p, F_OK) != 0, "--save dot/. made dot/..tmp inside the checkpoint");
}

int main(void)
{
    exe = getenv("LPX_TEST_LPX_EXE");
    const char *fx = getenv("LPX_TEST_LLAMA_FIXTURE"), *cp = getenv("LPX_TEST_CORPUS");
    if (!exe || !fx || !cp) {
        printf("LPX_TEST_LPX_EXE / LPX_TEST_LLAMA_FIXTURE / LPX_TEST_CORPUS not set: skipping\n");
        return 77;
    }
    snprintf(fixture, sizeof fixture, "%s", fx);
    snprintf(corpus, sizeof corpus, "%s", cp);
    snprintf(outdir, sizeof outdir, "/tmp/lpx-test-outputs.%ld", (long)getpid());
    mkdir(outdir, 0777);
    RUN(test_eval_outputs);
    RUN(test_train_outputs);
    RUN(test_outputs_that_clash);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", outdir);
    if (!getenv("LPX_TEST_KEEP") && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", outdir);
    return CHECK_DONE();
}
