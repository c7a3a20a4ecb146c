/* The Llama 3 model against transformers: `lpx eval` on the fixture in
 * tests/data/llama_tiny/ (a random LlamaForCausalLM with GQA, rope_theta
 * 500000 and Llama 3.1 rope scaling, untied head, sharded bf16 weights;
 * made by tests/data/make_llama_fixture.py) must give transformers' loss,
 * logits and every parameter's gradient within 1e-5 of each tensor's
 * largest magnitude (f32; measured 6.5e-7 and 1.05e-6: the margin covers
 * another CPU's BLAS summing in another order, and a 1.5x error in any
 * op is orders of magnitude above it). Then the same model read with a transformers
 * 4.x config.json, Hugging Face checkpoints written by `lpx train
 * --save-hf` (untied and tied) read back, training from a Hugging Face
 * directory on token ids, and the bad inputs: another architecture, a
 * missing shard, a config that disagrees with the weights, a token past the
 * vocabulary: one line each, exit 2, nothing written. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "run_util.h"
#include "llama_ref.h"
#include "lpx/lpx.h"

static char fixture[512], outdir[256], corpus[512];

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* max |a - b| / max |b| over every tensor of ref (a from got, same name) */
static double worst_rel(const char *got, const char *ref, int *compared, char *worst_name, size_t n)
{
    lpx_safetensors *fg = NULL, *fr = NULL;
    double worst = INFINITY;
    *compared = 0;
    if (lpx_safetensors_open(got, &fg) || lpx_safetensors_open(ref, &fr)) goto out;
    worst = 0;
    for (int i = 0; i < lpx_safetensors_count(fr); i++) {
        const char *name = lpx_safetensors_name(fr, i);
        lpx_tensor *a = NULL, *b = NULL;
        if (lpx_safetensors_get(fg, name, &a) || lpx_safetensors_get(fr, name, &b) ||
            lpx_tensor_numel(a) != lpx_tensor_numel(b) || lpx_tensor_dtype(a) != LPX_F32 ||
            lpx_tensor_dtype(b) != LPX_F32) {
            fprintf(stderr, "    %s: missing or of another size/dtype in %s\n", name, got);
            worst = INFINITY;
        } else {
            const float *x = lpx_tensor_data(a), *y = lpx_tensor_data(b);
            double d = 0, m = 0;
            for (int64_t k = 0; k < lpx_tensor_numel(b); k++) {
                d = fmax(d, fabs((double)x[k] - y[k]));
                m = fmax(m, fabs((double)y[k]));
            }
            double r = m > 0 ? d / m : d;
            if (r > worst) {
                worst = r;
                snprintf(worst_name, n, "%s", name);
            }
            ++*compared;
        }
        lpx_tensor_release(a);
        lpx_tensor_release(b);
    }
out:
    lpx_safetensors_close(fg);
    lpx_safetensors_close(fr);
    return worst;
}

static double loss_of(const char *out)
{
    const char *s = strstr(out, "mean next-token loss ");
    return s ? atof(s + strlen("mean next-token loss ")) : NAN;
}

static double expected_loss(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/expected.json", fixture);
    char *j = slurp(path);
    const char *s = j ? strstr(j, "\"loss\": ") : NULL;
    double v = s ? atof(s + 8) : NAN;
    free(j);
    return v;
}

static void test_logits_and_grads_equal_transformers(void)
{
    char args[4096], out[8192], lg[600], gr[600], ref[600], name[128] = "";
    snprintf(lg, sizeof lg, "%s/logits.safetensors", outdir);
    snprintf(gr, sizeof gr, "%s/grads.safetensors", outdir);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s' --grads '%s'", fixture, fixture,
             lg, gr);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "eval exited %d: %s", rc, out);
    double want = expected_loss(), got = loss_of(out);
    CHECKF(fabs(got - want) <= 1e-5 * fabs(want), "loss %.7f, transformers %.7f", got, want);
    int n = 0;
    snprintf(ref, sizeof ref, "%s/logits.safetensors", fixture);
    double w = worst_rel(lg, ref, &n, name, sizeof name);
    printf("  logits: max |lpx - transformers| = %.2e of max |logit|\n", w);
    CHECKF(n == 1 && w <= 1e-5, "logits off by %.3g (relative to the largest)", w);
    snprintf(ref, sizeof ref, "%s/grads.safetensors", fixture);
    w = worst_rel(gr, ref, &n, name, sizeof name);
    printf("  gradients: %d parameters, worst %.2e of the tensor's max (%s)\n", n, w, name);
    CHECKF(n == 21 && w <= 1e-5, "gradients: %d compared, worst %.3g (%s)", n, w, name);
}

/* The ops a Llama needs, composed directly (tests/llama_ref.h, not
 * tools/train), give transformers' logits in f32 and in bf16 (weights and
 * activations bf16, each op's result rounded once): the bounds the GPU
 * suite holds its kernels to on the same composition. */
static void test_ops_compose_to_transformers(void) { lref_check_compose(fixture, lpx_cpu(), "composition on the CPU"); }

/* The same checkpoint with a transformers 4.x config.json (rope_theta and
 * rope_scaling at the top level, "type" instead of "rope_type"): the same
 * loss. The shards are linked, not copied. */
static void test_config_4x(void)
{
    char dir[600], cmd[4096], out[8192];
    snprintf(dir, sizeof dir, "%s/v4", outdir);
    mkdir(dir, 0777);
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"};
    for (int i = 0; i < 3; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", fixture, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (symlink(a, b) != 0) CHECKF(0, "symlink %s", b);
    }
    snprintf(cmd, sizeof cmd, "%s/config.json", dir);
    spit(cmd, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,\n"
              " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
              " \"num_key_value_heads\": 2, \"vocab_size\": 128, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,\n"
              " \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,\n"
              " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}, \"tie_word_embeddings\": false,\n"
              " \"hidden_act\": \"silu\", \"transformers_version\": \"4.46.0\"}\n");
    snprintf(cmd, sizeof cmd, "eval --init '%s' --tokens '%s/tokens.bin'", dir, fixture);
    CHECK(run(cmd, out, sizeof out) == 0);
    double want = expected_loss(), got = loss_of(out);
    CHECKF(fabs(got - want) <= 1e-5 * fabs(want), "4.x config: loss %.7f, transformers %.7f (%s)", got, want, out);
}

/* Every config.json field lpx reads, one at a time set to a value that
 * is not the fixture's (the fixture's equal lpx's defaults or presets:
 * eps 1e-5, theta 500000, Llama 3.1 scaling 8/1/4/64, untied, kv 2 of 4
 * heads, head_dim = hidden / heads): each changes the loss of the
 * fixture's weights (by 0.02 or more, measured; the loss is printed to
 * 1e-6), or, for a field that fixes a weight's shape, is refused naming
 * the shape it implies. A field read but not used, or read into the wrong
 * place, leaves the loss at the fixture's. The equivalences: rope_type
 * "default" with the llama3 factors still given is the unscaled rope
 * (the same loss as no factors at all); max_position_embeddings does not
 * change the forward (transformers' neither). The shards are linked. */
static void test_config_every_field(void)
{
    static const struct { const char *from, *to, *refusal; } cases[] = {
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0.1", NULL},
        {"\"rope_theta\": 500000.0", "\"rope_theta\": 10000.0", NULL},
        {"\"factor\": 8.0", "\"factor\": 2.0", NULL},
        {"\"low_freq_factor\": 1.0", "\"low_freq_factor\": 2.0", NULL},
        {"\"high_freq_factor\": 4.0", "\"high_freq_factor\": 8.0", NULL},
        {"\"original_max_position_embeddings\": 64", "\"original_max_position_embeddings\": 16", NULL},
        {"\"rope_type\": \"llama3\"", "\"rope_type\": \"default\"", NULL},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true", NULL},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 1", "k_proj.weight is bf16 [32, 64]; config.json says [16, 64]"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", "k_proj.weight is bf16 [32, 64]; config.json says [64, 64]"},
        {"\"head_dim\": 16", "\"head_dim\": 32", "head_dim 32 is not hidden_size / num_attention_heads (16)"},
    };
    char path[1200], dir[600], cmd[4096];
    static char out[8192];
    snprintf(path, sizeof path, "%s/config.json", fixture);
    char *base = slurp(path);
    CHECK(base != NULL);
    if (!base) return;
    snprintf(dir, sizeof dir, "%s/fields", outdir);
    mkdir(dir, 0777);
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"};
    for (int i = 0; i < 3; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", fixture, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (symlink(a, b) != 0) CHECKF(0, "symlink %s", b);
    }
    snprintf(cmd, sizeof cmd, "eval --init '%s' --tokens '%s/tokens.bin'", fixture, fixture);
    CHECK(run(cmd, out, sizeof out) == 0);
    double fixture_loss = loss_of(out), rope_default = NAN;
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(cmd, sizeof cmd, "eval --init '%s' --tokens '%s/tokens.bin'", dir, fixture);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *at = strstr(base, cases[k].from);
        CHECKF(at && !strstr(at + 1, cases[k].from), "'%s' is not once in the fixture's config.json", cases[k].from);
        if (!at) continue;
        size_t n = strlen(base) + strlen(cases[k].to) + 1;
        char *text = malloc(n);
        snprintf(text, n, "%.*s%s%s", (int)(at - base), base, cases[k].to, at + strlen(cases[k].from));
        spit(path, text);
        free(text);
        int rc = run(cmd, out, sizeof out);
        if (cases[k].refusal) {
            CHECKF(rc == 2 && strstr(out, cases[k].refusal) && count_lines(out) == 1, "%s: exit %d: %s", cases[k].to, rc,
                   out);
            continue;
        }
        double got = loss_of(out);
        CHECKF(rc == 0 && fabs(got - fixture_loss) >= 1e-3, "%s: loss %.6f, the fixture's %.6f (exit %d: %s)",
               cases[k].to, got, fixture_loss, rc, out);
        if (strstr(cases[k].to, "default")) rope_default = got;
    }
    /* rope_type default without the factors: the same loss as with them */
    spit(path, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,\n"
               " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
               " \"num_key_value_heads\": 2, \"vocab_size\": 128, \"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-05}\n");
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECKF(loss_of(out) == rope_default, "no rope scaling: loss %.6f; rope_type default: %.6f", loss_of(out), rope_default);
    /* rms_norm_eps left out: transformers' default, 1e-6 (not the fixture's 1e-5) */
    double eps_default = NAN;
    for (int k = 0; k < 2; k++) {
        char text[600];
        snprintf(text, sizeof text, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
                 "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                 "\"num_key_value_heads\": 2, \"vocab_size\": 128, \"rope_theta\": 500000.0%s}\n",
                 k ? ", \"rms_norm_eps\": 1e-06" : "");
        spit(path, text);
        CHECK(run(cmd, out, sizeof out) == 0);
        if (!k) eps_default = loss_of(out);
        else CHECKF(loss_of(out) == eps_default && eps_default != rope_default, "no rms_norm_eps: loss %.6f; 1e-6: %.6f; "
                    "1e-5: %.6f", eps_default, loss_of(out), rope_default);
    }
    /* max_position_embeddings below the 24 tokens: the same loss */
    const char *mp = strstr(base, "\"max_position_embeddings\": 512");
    CHECK(mp != NULL);
    if (mp) {
        size_t n = strlen(base) + 8;
        char *text = malloc(n);
        snprintf(text, n, "%.*s\"max_position_embeddings\": 8%s", (int)(mp - base), base,
                 mp + strlen("\"max_position_embeddings\": 512"));
        spit(path, text);
        free(text);
        CHECK(run(cmd, out, sizeof out) == 0);
        CHECKF(loss_of(out) == fixture_loss, "max_position_embeddings 8: loss %.6f, the fixture's %.6f", loss_of(out),
               fixture_loss);
    }
    free(base);
}

/* u16 token ids below 128 from the corpus bytes (a pre-tokenized file) */
static void write_ids(const char *path, int vocab)
{
    char *text = slurp(corpus);
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; text && f && text[i] && i < 20000; i++) {
        uint16_t id = (uint16_t)((unsigned char)text[i] % vocab);
        fwrite(&id, 2, 1, f);
    }
    if (f) fclose(f);
    free(text);
}

/* Fine-tune the fixture from its Hugging Face directory (float8 recipe,
 * token ids), write it back with --save-hf, read that with lpx eval: the
 * written model is a Llama checkpoint lpx (and transformers) can load. */
static void test_train_from_hf_and_save_hf(void)
{
    char args[4096], ids[600], saved[600], lg[600];
    static char out[65536];
    snprintf(ids, sizeof ids, "%s/ids.bin", outdir);
    write_ids(ids, 128);
    snprintf(saved, sizeof saved, "%s/saved", outdir);
    snprintf(args, sizeof args, "train --init '%s' --recipe float8-tensorwise --ranks 2 --micro 2 --batch 4 --steps 3 "
             "--seq 16 --eval 2 --sample 8 --data '%s' --save-hf '%s' --out '%s/ft'", fixture, ids, saved, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0 && strstr(out, "initial weights: ") && strstr(out, "(Hugging Face: config.json"), "train exited %d: %s",
           rc, out);
    /* the val loss before any step is the fixture's own model on the data */
    snprintf(lg, sizeof lg, "%s/saved.logits", outdir);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s'", saved, fixture, lg);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "eval of the saved model exited %d: %s", rc, out);
    double l = loss_of(out);
    /* three steps moved it, but it is the same model, not a random one
     * (ln 128 = 4.85 is a uniform guess; the fixture's loss is 5.40) */
    CHECKF(isfinite(l) && fabs(l - expected_loss()) < 1.0, "saved model's loss %.4f vs the fixture's %.4f", l,
           expected_loss());
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", saved);
    char *c = slurp(cfg);
    CHECKF(c && strstr(c, "\"LlamaForCausalLM\"") && strstr(c, "\"num_key_value_heads\":\t2") &&
           strstr(c, "\"rope_type\":\t\"llama3\""), "config.json: %s", c ? c : "(none)");
    free(c);
}

/* A tied model trained from scratch and saved: no lm_head.weight in the
 * file, tie_word_embeddings true, and lpx eval reads it back. */
static void test_tied_round_trip(void)
{
    char args[4096], saved[600], out2[8192], ids[600];
    static char out[65536];
    snprintf(saved, sizeof saved, "%s/tied", outdir);
    snprintf(ids, sizeof ids, "%s/ids.bin", outdir);
    snprintf(args, sizeof args, "train --recipe f32 --tied --dim 32 --heads 4 --kv-heads 1 --layers 1 --vocab 128 --ranks 2 "
             "--micro 2 --batch 4 --steps 2 --seq 16 --eval 2 --sample 0 --data '%s' --save-hf '%s' --out '%s/tr'",
             ids, saved, outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 0, "tied train exited %d: %s", rc, out);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin'", saved, fixture);
    rc = run(args, out2, sizeof out2);
    CHECKF(rc == 0 && isfinite(loss_of(out2)), "eval of the tied model exited %d: %s", rc, out2);
    lpx_safetensors *f = NULL;
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", saved);
    CHECK_OK(lpx_safetensors_open(path, &f));
    if (f) {
        CHECK(lpx_safetensors_kind_of(f, "model.embed_tokens.weight") != NULL);
        CHECK(lpx_safetensors_kind_of(f, "lm_head.weight") == NULL);
        CHECK(lpx_safetensors_count(f) == 1 + 9 + 1);
        lpx_safetensors_close(f);
    }
}

/* a copy of the fixture in DIR, with config.json replaced when cfg is given
 * and `skip` left out */
static void copy_fixture(const char *dir, const char *skip, const char *cfg)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, fixture, dir);
    CHECK(system(cmd) == 0);
    if (skip) {
        snprintf(cmd, sizeof cmd, "%s/%s", dir, skip);
        unlink(cmd);
    }
    if (cfg) {
        snprintf(cmd, sizeof cmd, "%s/config.json", dir);
        spit(cmd, cfg);
    }
}

static void test_bad_inputs(void)
{
    char dir[600], args[4096], out[8192], lg[600], bad_tok[600];
    snprintf(lg, sizeof lg, "%s/never.safetensors", outdir);
    char *cfg_path = malloc(700), *cfg = NULL;
    snprintf(cfg_path, 700, "%s/config.json", fixture);
    cfg = slurp(cfg_path);
    free(cfg_path);
    if (!cfg) {
        CHECK(cfg != NULL);
        return;
    }
    /* another architecture */
    char *mistral = strdup(cfg), *p = strstr(mistral, "LlamaForCausalLM");
    if (p) memcpy(p, "MistralForCausal", 16);
    snprintf(dir, sizeof dir, "%s/mistral", outdir);
    copy_fixture(dir, NULL, mistral);
    /* a missing shard */
    char dir2[600];
    snprintf(dir2, sizeof dir2, "%s/noshard", outdir);
    copy_fixture(dir2, "model-00002-of-00002.safetensors", NULL);
    /* a config that disagrees with the tensors */
    char *wide = strdup(cfg);
    p = strstr(wide, "\"intermediate_size\": 96");
    if (p) memcpy(p, "\"intermediate_size\": 64", 23);
    char dir3[600];
    snprintf(dir3, sizeof dir3, "%s/wide", outdir);
    copy_fixture(dir3, NULL, wide);
    /* a token past the vocabulary (128) */
    snprintf(bad_tok, sizeof bad_tok, "%s/bad.tok", outdir);
    uint32_t ids[4] = {3, 7, 200, 1};
    FILE *f = fopen(bad_tok, "wb");
    if (f) {
        fwrite(ids, sizeof ids, 1, f);
        fclose(f);
    }
    struct { const char *dir, *tokens, *want; } cases[] = {
        {dir, NULL, "describes MistralForCausal model; lpx reads Llama checkpoints"},
        {dir2, NULL, "model-00002-of-00002.safetensors is missing (a shard model.safetensors.index.json names)"},
        {dir3, NULL, "model.layers.0.mlp.gate_proj.weight is bf16 [96, 64]; config.json says [64, 64]"},
        {fixture, bad_tok, "token id 200 at position 2 is past the vocabulary (128)"},
        {outdir, NULL, "has no config.json: not a Hugging Face model directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char tok[700];
        snprintf(tok, sizeof tok, "%s/tokens.bin", fixture);
        snprintf(args, sizeof args, "eval --init '%s' --tokens '%s' --logits '%s'", cases[i].dir,
                 cases[i].tokens ? cases[i].tokens : tok, lg);
        int rc = run(args, out, sizeof out);
        CHECKF(rc == 2 && strstr(out, cases[i].want) && count_lines(out) == 1, "case %zu: exit %d, printed: %s", i, rc,
               out);
        CHECKF(!exists(lg), "case %zu wrote %s", i, lg);
    }
    /* lpx train refuses the same directories before writing anything */
    char tout[600];
    snprintf(tout, sizeof tout, "%s/never-out", outdir);
    snprintf(args, sizeof args, "train --init '%s' --steps 1 --out '%s'", dir3, tout);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "config.json says [64, 64]") && count_lines(out) == 1, "train: exit %d: %s", rc, out);
    CHECKF(!exists(tout), "train wrote %s", tout);
    snprintf(args, sizeof args, "train --init '%s' --dim 64 --steps 1 --out '%s'", fixture, tout);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "sets the model from its config.json") && count_lines(out) == 1, "train: %d %s", rc,
           out);
    /* a text corpus holding a byte past this model's vocabulary of 128 */
    char text[600];
    snprintf(text, sizeof text, "%s/utf8.txt", outdir);
    FILE *tf = fopen(text, "wb");
    for (int i = 0; tf && i < 600; i++) fputs(i == 300 ? "caf\xc3\xa9 " : "plain ascii ", tf);
    if (tf) fclose(tf);
    snprintf(args, sizeof args, "train --init '%s' --steps 1 --data '%s' --out '%s'", fixture, text, tout);
    rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "token id 195 at position 3603 is past the vocabulary (128)") && count_lines(out) == 1,
           "train: %d %s", rc, out);
    CHECKF(!exists(tout), "train wrote %s", tout);
    free(mistral);
    free(wide);
    free(cfg);
}

/* the presets answer at scale, and a model too big for this machine is
 * refused by the estimate before anything is allocated */
static void test_mem_presets_and_refusal(void)
{
    static char out[16384];
    const char *models[] = {"llama3-8b", "llama3-70b", "llama3-405b", "llama3.2-1b", "llama3.2-3b"};
    const long long params[] = {8030261248LL, 70553706496LL, 405853388800LL, 1235814400LL, 3212749824LL};
    for (int i = 0; i < 5; i++) {
        char args[256];
        snprintf(args, sizeof args, "mem --model %s --recipe float8-tensorwise --ranks 8,64 --ac full", models[i]);
        int rc = run(args, out, sizeof out);
        char want[64];
        snprintf(want, sizeof want, ": %lld params", params[i]);
        CHECKF(rc == 0 && strstr(out, want), "%s: exit %d, want '%s': %s", models[i], rc, want, out);
    }
    char args[1024];
    snprintf(args, sizeof args, "train --model llama3-405b --steps 1 --out '%s/huge'", outdir);
    int rc = run(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, "405853388800 params) needs about") && count_lines(out) == 1, "405b: %d %s", rc, out);
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
    snprintf(outdir, sizeof outdir, "/tmp/lpx-test-llama.%ld", (long)getpid());
    mkdir(outdir, 0777);
    RUN(test_logits_and_grads_equal_transformers);
    RUN(test_ops_compose_to_transformers);
    RUN(test_config_4x);
    RUN(test_config_every_field);
    RUN(test_train_from_hf_and_save_hf);
    RUN(test_tied_round_trip);
    RUN(test_bad_inputs);
    RUN(test_mem_presets_and_refusal);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", outdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", outdir);
    return CHECK_DONE();
}
