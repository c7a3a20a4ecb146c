/* `lpx eval --init DIR --tokens FILE [--logits OUT] [--grads OUT]`: the
 * forward of a Hugging Face Llama checkpoint on given token ids, so anyone
 * can compare lpx with another implementation (transformers, the test
 * fixture under tests/data/llama_tiny/).
 *
 * FILE holds one sequence of little-endian u32 ids. The loss is the mean
 * next-token cross-entropy over positions 0..n-2 (targets 1..n-1), what
 * transformers returns for labels = input_ids. --logits writes one f32
 * tensor `logits` [n, vocab]; --grads the gradient of that loss for every
 * parameter under its Hugging Face name (f32). One rank, the recipe's
 * numerics (default f32: the reference). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rank.h"
#include "outfile.h"
#include "hf.h"
#include "mem.h"
#include "../lpx/commands.h"

typedef struct ev_ctx {
    const tr_opts *o;
    const tr_geom *g;
    float *const *w;
    const int32_t *ids;
    int n;
    const char *logits_path, *grads_path;
    double loss;
    char msg[1024];   /* the rank's own error (without the comm runner's "rank 0:" wrapping) */
} ev_ctx;

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx eval --init DIR --tokens FILE [--logits OUT.safetensors] [--grads OUT.safetensors]\n"
               "                [--recipe R]\n"
               "  the forward of the Hugging Face Llama model in DIR on the token ids in FILE (one\n"
               "  sequence, little-endian u32); prints the mean next-token loss. --logits writes the\n"
               "  f32 logits [tokens, vocab] as tensor 'logits'; --grads the loss's gradient of every\n"
               "  parameter (Hugging Face names). --recipe: f32 (default), bf16, float8-tensorwise,\n"
               "  float8-rowwise, float8-delayed, float8-blockwise, nf4-qlora (the weights quantized to\n"
               "  NF4; no --grads), mxfp8, mxfp4 (the lpx-mx.so plugin)\n");
}

static lpx_status save_one(const char *path, const char *name, lpx_tensor *t)
{
    const char *names[1] = {name};
    return lpx_safetensors_save(path, 1, names, &t, 0, NULL);
}

static lpx_status save_grads(tr_rank *R, const char *path)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    char (*names)[96] = calloc((size_t)g->nparams, sizeof *names);
    const char **np = calloc((size_t)g->nparams, sizeof *np);
    lpx_tensor **ts = calloc((size_t)g->nparams, sizeof *ts);
    if (!names || !np || !ts) FAIL(LPX_ENOMEM, "eval: out of memory");
    for (int p = 0; p < g->nparams; p++) {
        tr_hf_name(&g->p[p], names[p], sizeof names[p]);
        np[p] = names[p];
        /* one rank: the grad "shard" is the whole gradient */
        ts[p] = lpx_fsdp_param_grad(R->grp[g->p[p].group], R->gi[p]);
        if (!ts[p]) FAIL(LPX_EINTERNAL, "eval: no gradient for %s", names[p]);
    }
    TRY(lpx_safetensors_save(path, g->nparams, np, ts, 0, NULL));
out:
    free(names);
    free(np);
    free(ts);
    return st;
}

static lpx_status ev_rank(lpx_comm *comm, void *arg)
{
    ev_ctx *E = arg;
    lpx_status st = LPX_OK;
    tr_rank *R = calloc(1, sizeof *R);
    tr_fwd f = {0};
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)E->n);
    bool set_up = false;
    if (!R || !tgt) FAIL(LPX_ENOMEM, "eval: out of memory");
    R->o = E->o;
    R->g = E->g;
    R->recipe = E->o->recipe;
    R->comm = comm;
    R->rank = 0;
    R->world = 1;
    TRY(tr_device_setup(R));
    TRY(tr_rank_alloc(R));
    set_up = true;
    TRY(tr_shard_setup(R, E->w));
    TRY(tr_recipe_setup(R));
    TRY(tr_model_setup(R));
    if (R->recipe == TR_F8_TENSORWISE) TRY(tr_precompute_scales(R));
    for (int i = 0; i < E->n; i++) tgt[i] = i + 1 < E->n ? E->ids[i + 1] : -100;
    bool grads = E->grads_path != NULL;
    R->training = false;
    TRY(tr_forward(R, &f, E->ids, tgt, 1, E->n, 0, (grads ? TR_FWD_GRADS : 0u) | (E->logits_path ? TR_FWD_LOGITS : 0u),
                   1.0));
    E->loss = f.loss;
    if (E->logits_path) TRY(save_one(E->logits_path, "logits", f.logits));
    if (grads) {
        TRY(tr_backward(R, &f, true));
        TRY(save_grads(R, E->grads_path));
    }
out:
    if (st) snprintf(E->msg, sizeof E->msg, "%s", lpx_last_error());
    if (R) {
        tr_fwd_clear(&f, E->g->layers);
        if (set_up) {
            tr_model_teardown(R);
            tr_recipe_teardown(R);
            tr_shard_teardown(R);
        }
        tr_rank_free(R);
        free(R);
    }
    free(tgt);
    return st;
}

/* the ids of FILE (u32 LE), each below vocab */
static lpx_status read_tokens(const char *path, int vocab, int32_t **out, int *n)
{
    *out = NULL;
    char *buf = NULL, what[600];
    size_t bytes = 0;
    lpx_status st = tr_read_file(path, 4u << 20, &buf, &bytes);
    if (st) {
        char why[512];
        snprintf(why, sizeof why, "%s", lpx_last_error());
        return lpx_error(st == LPX_ENOTFOUND ? LPX_EIO : st, "--tokens: %s", why);
    }
    if (bytes % 4 || bytes < 8) {
        free(buf);
        return lpx_error(LPX_EINVAL, "--tokens '%s' has %zu bytes: expected 2..1048576 little-endian u32 ids", path,
                         bytes);
    }
    *n = (int)(bytes / 4);
    if (!(*out = malloc(bytes))) st = lpx_error(LPX_ENOMEM, "out of memory");
    snprintf(what, sizeof what, "--tokens '%s'", path);
    /* int32 and uint32 ids share their representation below vocab (< 2^31) */
    if (!st) st = tr_token_ids((const unsigned char *)buf, (size_t)*n, 4, vocab, what, (uint32_t *)*out);
    free(buf);
    if (st) {
        free(*out);
        *out = NULL;
    }
    return st;
}

/* The weights read (f32) and lpx mem's estimate of the one rank fit this
 * machine's memory; else one line with both sizes, false. */
static bool fits_memory(const tr_opts *o, const tr_geom *g)
{
    tr_mem_est e;
    tr_mem_estimate_geom(g, o->recipe, 1, o->lora_rank, 1, 1, false, tr_act_dtype(o, o->recipe) == LPX_F32 ? 4 : 2,
                         false, &e);
    double rank = (double)e.params + (double)e.grads + (double)e.optimizer + (double)e.unsharded +
                  (double)e.activations + (double)e.transient;
    double need = rank + 4.0 * (double)tr_geom_numel(g);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
    double have = pages > 0 && psize > 0 ? (double)pages * (double)psize : INFINITY;
    if (need <= have) return true;
    fprintf(stderr, "lpx eval: the model (%lld params, vocab %d, dim %d, ffn %d) needs about %.1f GiB here (its f32 "
            "weights and lpx mem's %.1f GiB for the rank); this machine has %.1f GiB\n", (long long)tr_geom_numel(g),
            g->vocab, g->dim, g->hidden, need / 1073741824.0, rank / 1073741824.0, have / 1073741824.0);
    return false;
}

int lpx_cmd_eval(int argc, char **argv)
{
    const char *dir = NULL, *tokens = NULL, *logits = NULL, *grads = NULL;
    int recipe = TR_F32;
    for (int i = 1; i < argc; i++) {
        char buf[64];
        const char *iv = NULL, *a = tr_split_opt(argv[i], buf, sizeof buf, &iv);   /* --opt=value too */
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--init") && strcmp(a, "--tokens") && strcmp(a, "--logits") && strcmp(a, "--grads") &&
            strcmp(a, "--recipe")) {
            fprintf(stderr, "lpx eval: unknown option '%s' (lpx eval --help lists them)\n", a);
            return 2;
        }
        if (!iv && i + 1 >= argc) {
            fprintf(stderr, "lpx eval: option %s needs a value\n", a);
            return 2;
        }
        const char *v = iv ? iv : argv[++i];
        if (!strcmp(a, "--init")) dir = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--logits")) logits = v;
        else if (!strcmp(a, "--grads")) grads = v;
        else if (!strcmp(a, "--recipe")) {
            recipe = tr_recipe_from_name(v);
            if (recipe < 0) {
                fprintf(stderr, "lpx eval: --recipe '%s': expected f32, bf16, float8-tensorwise, float8-rowwise, "
                                "float8-delayed, float8-blockwise, nf4-qlora, mxfp8 or mxfp4\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "lpx eval: unknown option '%s' (lpx eval --help lists them)\n", a);
            return 2;
        }
    }
    if (!dir || !tokens) {
        fprintf(stderr, "lpx eval: give --init DIR (a Hugging Face Llama model) and --tokens FILE\n");
        return 2;
    }
    /* nf4-qlora evaluates the base quantized to NF4 (its adapters start at
     * zero: B = 0), which has no gradient of its own */
    if (recipe == TR_NF4_QLORA && grads) {
        fprintf(stderr, "lpx eval: --grads with --recipe nf4-qlora: the NF4 base is frozen (no gradient); give "
                        "another recipe\n");
        return 2;
    }
    /* the MX kinds come from the lpx-mx.so plugin, loaded as lpx train does */
    const lpx_kind *mx;
    if (tr_recipe_is_mx((tr_recipe)recipe) && tr_mx_kind((tr_recipe)recipe, &mx) != LPX_OK) {
        fprintf(stderr, "lpx eval: %s\n", lpx_last_error());
        return 2;
    }
    /* every output path checked before the model is read: a FIFO, a
     * device, a missing folder fail now, not after the run, and --logits
     * is not written when --grads cannot be */
    char out_a[4096], out_b[4096];
    if ((logits && lpx_output_path("--logits", logits, out_a, sizeof out_a) != LPX_OK) ||
        (grads && lpx_output_path("--grads", grads, out_b, sizeof out_b) != LPX_OK)) {
        fprintf(stderr, "lpx eval: %s\n", lpx_last_error());
        return 2;
    }
    if (logits && grads && !strcmp(out_a, out_b)) {
        fprintf(stderr, "lpx eval: --logits and --grads name one file ('%s'); give two\n", out_a);
        return 2;
    }
    /* an output is never one of the inputs (the tokens, a file of the
     * model folder): writing it would destroy what is being read */
    const char *outs[2] = {logits ? out_a : NULL, grads ? out_b : NULL}, *opt[2] = {"--logits", "--grads"};
    for (int k = 0; k < 2; k++) {
        const char *input = outs[k] ? tr_same_file_in(outs[k], tokens, dir) : NULL;
        if (input) {
            fprintf(stderr, "lpx eval: %s '%s' is the input '%s'; write the output elsewhere\n", opt[k], outs[k],
                    input);
            return 2;
        }
    }
    tr_opts o;
    bool help;
    char *targv[1] = {(char *)"train"};
    tr_parse_train(1, targv, &o, &help);
    o.recipe = (tr_recipe)recipe;
    o.ranks = 1;
    o.micro = 1;
    o.batch = 1;
    int rc = 2, n = 0;
    int32_t *ids = NULL;
    float **w = NULL;
    tr_geom g = {0};
    if (tr_hf_config(dir, &o.m) != LPX_OK) {
        fprintf(stderr, "lpx eval: %s\n", lpx_last_error());
        return 2;
    }
    if (tr_arch_check(&o.m, "lpx eval")) return 2;
    if (read_tokens(tokens, o.m.vocab, &ids, &n) != LPX_OK) {
        fprintf(stderr, "lpx eval: %s\n", lpx_last_error());
        return 2;
    }
    o.seq = n;
    if (tr_geom_init(&g, &o.m, n, false) != LPX_OK) {
        fprintf(stderr, "lpx eval: %s\n", lpx_last_error());   /* a model too big to size: refused like an option */
        goto done;
    }
    /* a model too big for this machine (a vocabulary of 2^31-1, an
     * intermediate size of 2^30) is refused before anything is allocated,
     * with the size it needs: an int64 overflow of the estimate, else the
     * weights read (f32) plus lpx mem's estimate of the one rank */
    if (tr_mem_estimate_check(&g, 1, o.lora_rank, 1, tr_act_dtype(&o, o.recipe) == LPX_F32 ? 4 : 2, "lpx eval") !=
        LPX_OK) {
        fprintf(stderr, "%s\n", lpx_last_error());
        goto done;
    }
    if (!fits_memory(&o, &g)) goto done;
    w = calloc((size_t)g.nparams, sizeof *w);
    if (!w) {
        lpx_error(LPX_ENOMEM, "out of memory for %d parameter tensors", g.nparams);
        goto fail;
    }
    for (int p = 0; p < g.nparams; p++)
        if (!(w[p] = malloc(sizeof(float) * (size_t)(g.p[p].rows * g.p[p].cols)))) {
            lpx_error(LPX_ENOMEM, "out of memory for %s [%lld, %lld] (%.2f GiB of f32)", g.p[p].name,
                      (long long)g.p[p].rows, (long long)g.p[p].cols,
                      4.0 * (double)g.p[p].rows * (double)g.p[p].cols / 1073741824.0);
            goto fail;
        }
    if (tr_hf_load(dir, &g, w) != LPX_OK) {
        fprintf(stderr, "lpx eval: %s\n", lpx_last_error());
        goto done;
    }
    ev_ctx E = {.o = &o, .g = &g, .w = w, .ids = ids, .n = n, .logits_path = logits, .grads_path = grads};
    if (lpx_comm_run("local", 1, 0, ev_rank, &E, NULL) != LPX_OK) {
        fprintf(stderr, "lpx eval: %s\n", E.msg[0] ? E.msg : lpx_last_error());
        rc = 1;
        goto done;
    }
    printf("lpx eval: %s, %d tokens, recipe %s: mean next-token loss %.6f\n", dir, n, tr_recipe_name(o.recipe), E.loss);
    if (logits) printf("  wrote %s (logits [%d, %d] f32)\n", logits, n, g.vocab);
    if (grads) printf("  wrote %s (the loss's gradient of %d parameters, f32)\n", grads, g.nparams);
    rc = 0;
    goto done;
fail:
    /* every path here has set its message; an empty one is a bug, named so */
    fprintf(stderr, "lpx eval: %s\n", lpx_last_error()[0] ? lpx_last_error() : "failed without a message (a bug)");
    rc = 1;
done:
    for (int p = 0; w && p < g.nparams; p++) free(w[p]);
    free(w);
    free(ids);
    tr_geom_free(&g);
    return rc;
}
