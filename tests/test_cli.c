/* The `lpx` command: exit codes and output of info, help, bench routing and
 * usage errors. Runs the built executable (path from LPX_TEST_LPX_EXE). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include "check.h"
#include "run_util.h"


static void test_info(void)
{
    char out[8192];
    CHECK(run("info", out, sizeof out) == 0);
    CHECK(strstr(out, "lpx 0.1.0") != NULL);
    CHECK(strstr(out, "f8e4m3fn") && strstr(out, "bf16") && strstr(out, "bool"));
    CHECK(strstr(out, "backends (1): cpu") != NULL);
    CHECK(strstr(out, "ops: ") != NULL);
    CHECK(strstr(out, "blockwise fp8 GEMM (fp8_mm_block): cpu (reference") != NULL);
    CHECK(run("info --bogus", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown option") != NULL);
}

static void test_usage_errors(void)
{
    char out[8192];
    CHECK(run("", out, sizeof out) == 2);
    CHECK(strstr(out, "usage:") != NULL);
    CHECK(run("frobnicate", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown command 'frobnicate'") != NULL);
    CHECK(run("bench", out, sizeof out) == 2);
    CHECK(run("bench nosuch", out, sizeof out) == 2);
    CHECK(strstr(out, "unknown benchmark 'nosuch'") != NULL);
    CHECK(run("bench dispatch --nosuchflag", out, sizeof out) == 2);
    CHECK(run("bench ckpt --mb 3", out, sizeof out) == 2);
    /* the checkpoint bench end to end, small: three rows, its directory removed */
    CHECK(run("bench ckpt --mb 8 --ranks 2", out, sizeof out) == 0);
    CHECK(strstr(out, "save (write+fsync, index, commit)") && strstr(out, "load, resharded"));
    CHECK(strstr(out, "load, same world, from disk") && strstr(out, "disk read (cold)") && strstr(out, "MB/s per rank"));
    CHECK(run("help", out, sizeof out) == 0);
    CHECK(run("--version", out, sizeof out) == 0);
    CHECK(strstr(out, "0.1.0") != NULL);
}

/* writes dir/config.json: the tiny Llama fixture's config with vocab,
 * hidden size (head dim: a quarter of it) and intermediate size given */
static void eval_config(const char *dir, long vocab, long dim, long ffn)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_act\": \"silu\", "
               "\"hidden_size\": %ld, \"head_dim\": %ld, \"intermediate_size\": %ld, \"num_attention_heads\": 4, "
               "\"num_hidden_layers\": 2, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, "
               "\"tie_word_embeddings\": false, \"vocab_size\": %ld}\n", dim, dim / 4, ffn, vocab);
    fclose(f);
}

/* lpx eval on a config.json too big to run (issue 33: a vocab_size of
 * 2^31-1 or an intermediate_size of 2^30 ended with "lpx eval: " and
 * nothing more, exit 1): refused before anything is allocated, in one line
 * with the parameter count and the memory it needs, exit 2; a model past
 * 2^50 parameters (whose sizes would overflow int64) likewise */
static void test_eval_too_big(void)
{
    char dir[] = "/tmp/lpx-cli-eval-XXXXXX", path[512], args[1200];
    static char out[8192];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        const unsigned char ids[16] = {1, 0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0};
        fwrite(ids, 1, sizeof ids, f);
        fclose(f);
    }
    static const struct {
        long vocab, dim, ffn;
        const char *want;
    } cases[] = {
        {2147483647L, 64, 96, "lpx eval: the model (274877968576 params, vocab 2147483647, dim 64, ffn 96) needs about "
                              "6720.0 GiB here (its f32 weights and lpx mem's 5696.0 GiB for the rank)"},
        {128, 64, 1073741824L, "lpx eval: the model (412316901696 params, vocab 128, dim 64, ffn 1073741824) needs "
                               "about 10080.0 GiB here"},
        {2147483647L, 1073741824L, 96, "lpx eval: model: 1.15e+19 parameters (vocab 2147483647, dim 1073741824, ffn 96, "
                                       "2 layers): more than the 2^50"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        eval_config(dir, cases[i].vocab, cases[i].dim, cases[i].ffn);
        snprintf(args, sizeof args, "eval --init '%s' --tokens '%s'", dir, path);
        int rc = run(args, out, sizeof out);
        const char *nl = strchr(out, '\n');
        CHECKF(rc == 2 && strstr(out, cases[i].want) && nl && !nl[1], "case %zu: exit %d, want '%s': %s", i, rc,
               cases[i].want, out);
    }
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    CHECK(system(args) == 0);
}

int main(void)
{
    exe = getenv("LPX_TEST_LPX_EXE");
    if (!exe) {
        printf("LPX_TEST_LPX_EXE not set: skipping\n");
        return 77; /* meson's skip code */
    }
    RUN(test_info);
    RUN(test_usage_errors);
    RUN(test_eval_too_big);
    return CHECK_DONE();
}
