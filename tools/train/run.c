/* `lpx train`'s run, once launch.c has checked and refused what it must:
 * the corpus, the model's geometry, the memory guard, the initial weights
 * (a checkpoint, a Hugging Face folder, or random), nf4-qlora's base (a
 * bf16 pre-training saved as the Hugging Face folder OUT/base), the
 * recipe runs (tr_run_recipe: rank_loop.c) and the report (report.c). */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rank.h"
#include "metrics.h"
#include "mem.h"
#include "hf.h"

/* ---- initial weights ---- */

/* One parameter's initial values into w[p]. */
static lpx_status init_one(const tr_geom *g, uint64_t seed, float **w, int p)
{
    lpx_status st = LPX_OK;
    lpx_tensor *t = NULL;
    const tr_param *P = &g->p[p];
    int64_t n = P->rows * P->cols;
    if (P->kind == TR_P_NORM || P->kind == TR_P_NORMF) {
        for (int64_t i = 0; i < n; i++) w[p][i] = 1.0f;
        return LPX_OK;
    }
    /* transformers' LlamaForCausalLM (_init_weights): normal(0,
     * initializer_range 0.02) for the embedding, every linear and an
     * untied head; ones for the norms. The logits then start near
     * uniform at any width (first loss ~ ln(vocab)) */
    const double std = 0.02;
    int64_t shape[1] = {n};
    TRY(lpx_randn(1, shape, seed * 1000003u + (uint64_t)p, LPX_F32, lpx_cpu(), &t));
    const float *r = lpx_tensor_data(t);
    for (int64_t i = 0; i < n; i++) w[p][i] = (float)(r[i] * std);
out:
    lpx_tensor_release(t);
    return st;
}

/* The parameters are drawn on several threads (each from its own seed,
 * so the values do not depend on the thread count): single-threaded, a
 * Llama-3-8B-shaped model of 8 layers (2.8e9 values) took about a minute
 * of CPU before its first GPU step. Largest first; as many threads as
 * CPUs (at most 16) and as the largest parameter's f32 temporary fits
 * 1/8 of the machine's memory (each thread holds one). */
typedef struct init_job {
    const tr_geom *g;
    uint64_t seed;
    float **w;
    const int *order;
    atomic_int next;
    atomic_int failed;
    pthread_mutex_t mu;
    lpx_status st;
    char err[512];
} init_job;

static void *init_worker(void *arg)
{
    init_job *J = arg;
    for (;;) {
        int k = atomic_fetch_add(&J->next, 1);
        if (k >= J->g->nparams || atomic_load(&J->failed)) break;
        lpx_status st = init_one(J->g, J->seed, J->w, J->order[k]);
        if (st != LPX_OK) {
            pthread_mutex_lock(&J->mu);
            if (!atomic_load(&J->failed)) {
                J->st = st;
                snprintf(J->err, sizeof J->err, "%s", lpx_last_error());
                atomic_store(&J->failed, 1);
            }
            pthread_mutex_unlock(&J->mu);
            break;
        }
    }
    return NULL;
}

static const tr_geom *g_sort_geom;

static int by_size_desc(const void *a, const void *b)
{
    const tr_param *x = &g_sort_geom->p[*(const int *)a], *y = &g_sort_geom->p[*(const int *)b];
    int64_t nx = x->rows * x->cols, ny = y->rows * y->cols;
    return nx < ny ? 1 : nx > ny ? -1 : *(const int *)a - *(const int *)b;
}

static lpx_status init_params(const tr_geom *g, uint64_t seed, float **w)
{
    int np = g->nparams;
    if (np <= 0) return LPX_OK;
    int *order = malloc((size_t)np * sizeof *order);
    if (!order) return lpx_error(LPX_ENOMEM, "train: out of memory");
    for (int p = 0; p < np; p++) order[p] = p;
    g_sort_geom = g;
    qsort(order, (size_t)np, sizeof *order, by_size_desc);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
    double largest = 4.0 * (double)(g->p[order[0]].rows * g->p[order[0]].cols) + 1.0;
    double room = pages > 0 && psize > 0 ? (double)pages * (double)psize / 8.0 : largest;
    int nt = cpus > 0 ? (int)(cpus < 16 ? cpus : 16) : 1;
    if ((double)nt > room / largest) nt = (int)(room / largest);
    if (nt > np) nt = np;
    if (nt < 1) nt = 1;
    init_job J = {.g = g, .seed = seed, .w = w, .order = order, .st = LPX_OK};
    atomic_init(&J.next, 0);
    atomic_init(&J.failed, 0);
    pthread_mutex_init(&J.mu, NULL);
    pthread_t th[16];
    int started = 0;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[started], NULL, init_worker, &J) != 0) break;
        started++;
    }
    init_worker(&J);   /* this thread too (alone when no thread started) */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&J.mu);
    free(order);
    if (atomic_load(&J.failed)) return lpx_error(J.st, "%s", J.err);
    return LPX_OK;
}

static float **alloc_params(const tr_geom *g)
{
    float **w = calloc((size_t)g->nparams, sizeof *w);
    if (!w) return NULL;
    for (int p = 0; p < g->nparams; p++)
        if (!(w[p] = malloc(sizeof(float) * (size_t)(g->p[p].rows * g->p[p].cols)))) {
            for (int q = 0; q < p; q++) free(w[q]);
            free(w);
            return NULL;
        }
    return w;
}

static void free_params(const tr_geom *g, float **w)
{
    if (!w) return;
    for (int p = 0; p < g->nparams; p++) free(w[p]);
    free(w);
}

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

/* data/corpus.txt from the working directory, else from the source tree
 * next to the build directory of this executable */
static void default_corpus(char *out, size_t n)
{
    snprintf(out, n, "data/corpus.txt");
    if (file_exists(out)) return;
    char exe[1024];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return;
    exe[k] = 0;
    static const char *const rel[] = {"/../../../data/corpus.txt", "/../share/lpx/corpus.txt"};
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        snprintf(out, n, "%s%s", exe, rel[i]);
        if (file_exists(out)) return;
    }
    snprintf(out, n, "data/corpus.txt");
}

/* Ranks are threads: BLAS threads on top of them oversubscribe the cores
 * (5x slower on 2 cores). One BLAS thread per rank, unless the user chose
 * with OPENBLAS_NUM_THREADS. */
static void one_blas_thread(void)
{
    if (getenv("OPENBLAS_NUM_THREADS")) return;
    void (*set)(int) = (void (*)(int))(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
    if (set) set(1);
}

/* --inject-nan's PARAM: "loss", or a parameter with a gradient */
static bool inject_target_ok(const tr_opts *o, const tr_geom *g)
{
    const char *w = o->inject_nan_param;
    if (!w[0] || !strcmp(w, "loss")) return true;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        char a[64], b[64];
        snprintf(a, sizeof a, "%s.lora_a", P->name);
        snprintf(b, sizeof b, "%s.lora_b", P->name);
        if (o->recipe == TR_NF4_QLORA ? P->kind == TR_P_LIN && (!strcmp(w, P->name) || !strcmp(w, a) || !strcmp(w, b))
                                      : !strcmp(w, P->name))
            return true;
    }
    return false;
}

int tr_train_run(tr_opts *op, const tr_ckpt *ck, bool lead, bool hf_init)
{
    tr_opts o = *op;
    const char *hf_rows = NULL;   /* --init DIR imported by rows on the ranks */
    one_blas_thread();
    char cpath[1200];
    if (o.data_path) snprintf(cpath, sizeof cpath, "%s", o.data_path);
    else default_corpus(cpath, sizeof cpath);
    tr_corpus corpus;
    if (tr_corpus_load(cpath, o.m.vocab, o.tokens_dtype, &corpus) != LPX_OK) {
        if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
        return 2;
    }
    o.m.vocab = corpus.vocab;
    if (corpus.n - corpus.n_train < (size_t)o.seq + 2) {
        if (lead) fprintf(stderr, "lpx train: corpus '%s' is too small for --seq %d\n", cpath, o.seq);
        tr_corpus_free(&corpus);
        return 2;
    }
    tr_geom *g = calloc(1, sizeof *g);
    tr_result res[3];
    int nres = 0, main_idx = 0, base_idx = -1, rc = 1;
    float **init = NULL, **base = NULL, **final = NULL;
    lpx_status st = LPX_OK;
    memset(res, 0, sizeof res);
    if (!g) FAIL(LPX_ENOMEM, "out of memory");
    TRY(tr_geom_init(g, &o.m, o.seq, o.wrap_linear));
    tr_mem_run mr = {.pretrain = o.recipe == TR_NF4_QLORA && !ck && !hf_init && !o.init_path,
                     .compare = o.compare, .weight_copies = o.recipe == TR_NF4_QLORA && !ck && !hf_init ? 2 : 1,
                     .corpus_bytes = (double)corpus.n * sizeof *corpus.tok};
    if (!tr_fits_memory(&o, g, lead, &mr)) {
        rc = 2;
        goto out;
    }
    /* a byte corpus under a tokenizer's vocabulary (--model llama3.2-1b
     * without --data FILE.bin) trains 256 of its rows: said (once the run
     * is known to fit), not refused */
    if (corpus.bytes && o.m.vocab > 256 && lead)
        fprintf(stderr, "lpx train: warning: corpus '%s' is text read as bytes (token ids 0..255) but the model's "
                        "vocabulary is %d: %d embedding rows never see a token; give --data FILE.bin with the ids of "
                        "the model's tokenizer\n", cpath, o.m.vocab, o.m.vocab - 256);
    if (!inject_target_ok(&o, g)) {
        if (lead) fprintf(stderr, "lpx train: --inject-nan: no parameter '%s' with a gradient (e.g. b0.wq%s, or loss)\n",
                          o.inject_nan_param, o.recipe == TR_NF4_QLORA ? ".lora_a" : "");
        rc = 2;
        goto out;
    }
    if (ck && ck->data_bytes && lead) {
        uint64_t h = 0, n = 0;
        if (tr_file_fnv(cpath, &h, &n) != LPX_OK || h != ck->data_fnv || n != ck->data_bytes)
            fprintf(stderr, "lpx train: warning: --resume: corpus '%s' is not the checkpoint's ('%s'); its batches "
                            "continue at step %d of this one\n", cpath, ck->data_path, ck->step + 1);
    }
    init = alloc_params(g);
    if (!init) FAIL(LPX_ENOMEM, "out of memory");
    if (ck) {
        /* the checkpoint's weights, every name and shape checked: a
         * mismatch is refused like a bad option (exit 2) */
        if (tr_ckpt_check_model(ck, g, &o) != LPX_OK ||
            (ck->sharded ? init_params(g, o.seed, init) : tr_ckpt_v2_load_weights(ck, g, &o, init)) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            rc = 2;
            goto out;
        }
    } else if (hf_init) {
        /* every name and shape checked here; the weights themselves: each
         * rank imports its rows after setup (tr_hf_import), except
         * nf4-qlora, whose frozen base is quantized whole */
        bool whole = o.recipe == TR_NF4_QLORA;
        if (tr_hf_load(o.init_path, g, whole ? init : NULL) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            rc = 2;
            goto out;
        }
        if (!whole) {
            TRY(init_params(g, o.seed, init));   /* the shape of the model, overwritten by the import */
            hf_rows = o.init_path;
        }
    } else {
        TRY(init_params(g, o.seed, init));
    }
    /* the weights are in and checked: from here on the run writes */
    if (lead && mkdir(o.out_dir, 0777) != 0 && access(o.out_dir, W_OK) != 0)
        FAIL(LPX_EIO, "cannot create --out '%s'", o.out_dir);
    if (!o.quiet)
        printf("lpx train: %s on %d %s ranks, corpus %s (%zu %s, vocab %d), %lld params, wrap %s\n",
               tr_recipe_name(o.recipe), o.ranks, o.comm, cpath, corpus.n, corpus.bytes ? "bytes" : "tokens",
               corpus.vocab, (long long)tr_geom_numel(g), o.wrap_linear ? "linear" : "block");
    if (ck && !o.quiet) {
        printf("  resuming %s at step %d (checkpoint: %s on %d ranks; now %s on %d)\n", ck->dir, ck->step,
               tr_recipe_name(ck->cfg.recipe), ck->cfg.ranks, tr_recipe_name(o.recipe), o.ranks);
        if (o.recipe == TR_F8_DELAYED && !ck->has_recipe_state)
            printf("  the checkpoint holds no float8-delayed amax histories (recipe %s): they start empty\n",
                   tr_recipe_name(ck->cfg.recipe));
    }
    if (hf_init && !o.quiet) printf("  initial weights: %s (Hugging Face)\n", o.init_path);

    if (o.recipe == TR_NF4_QLORA && (ck || hf_init)) {
        /* the checkpoint's (or the Hugging Face model's) weights are the frozen base */
        base = init;
        init = NULL;
    } else if (o.recipe == TR_NF4_QLORA) {
        /* the base (--init DIR: the branch above): a short bf16 pre-training
         * run, saved as the Hugging Face folder OUT/base, which --init takes */
        base = alloc_params(g);
        if (!base) FAIL(LPX_ENOMEM, "out of memory");
        tr_span pre = {.start = 0, .end = o.pretrain_steps};
        TRY(tr_run_recipe(&o, TR_BF16, "bf16-pretrain", o.pretrain_steps, &pre, g, &corpus, init, base, false,
                          &res[nres]));
        nres++;
        char bdir[1200];
        snprintf(bdir, sizeof bdir, "%s/base", o.out_dir);
        if (lead) TRY(tr_hf_save(bdir, g, base));
        if (!o.quiet) printf("  base checkpoint: %s (Hugging Face)\n", bdir);
    }
    float *const *start = base ? base : init;
    tr_span span = {.start = ck ? ck->step : 0, .end = o.stop_after ? o.stop_after : o.steps, .main = true, .ck = ck,
                    .hf_import = hf_rows};
    TRY(lpx_trace_start(NULL));
    main_idx = nres;
    /* --save-hf: every rank writes its rows of the model at the end of
     * the run (tr_hf_export); config.json last */
    if (o.save_hf && lead) TRY(tr_hf_make_dir(o.save_hf));
    st = tr_run_recipe(&o, o.recipe, tr_recipe_name(o.recipe), o.steps, &span, g, &corpus, start, final, true, &res[nres]);
    lpx_trace_stop();
    if (st != LPX_OK) goto out;
    nres++;
    if (o.save_hf && lead) {
        TRY(tr_hf_write_config(o.save_hf, g, hf_init ? o.init_path : NULL));
        if (!o.quiet) printf("  wrote %s (Hugging Face: config.json, model.safetensors)\n", o.save_hf);
    }
    /* --compare: the baseline is bf16 with f32 AdamW state and f32 masters
     * (so --optim / --master are compared against it too) */
    bool lowp = o.optim || o.master;
    if (o.compare && (o.recipe != TR_BF16 || lowp)) {
        base_idx = nres;
        tr_span all = {.start = 0, .end = o.steps, .hf_import = hf_rows};
        tr_opts ob = o;
        ob.optim = 0;
        ob.master = 0;
        TRY(tr_run_recipe(&ob, TR_BF16, lowp ? "bf16-adamw-f32" : "bf16", o.steps, &all, g, &corpus, start, NULL, true,
                          &res[nres]));
        nres++;
    } else if (o.recipe == TR_BF16 && !lowp) {
        base_idx = main_idx;
    }
    if (!lead) goto out;    /* the other MPI ranks: rank 0 reports */
    tr_print_summary(&o, g, res, nres, main_idx, base_idx, &mr);
    tr_print_dispatch(&o);
    TRY(tr_write_metrics(o.out_dir, res, nres));
    printf("\nwrote %s/metrics.csv and %s/loss.svg\n", o.out_dir, o.out_dir);
    if (o.sample_len > 0) printf("\nsample (%s, temperature 0.8):\n%s\n", res[main_idx].label, res[main_idx].sample);
out:
    if (st != LPX_OK) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
    for (int r = 0; r < 3; r++) free(res[r].rec);
    if (g) {
        free_params(g, init);
        free_params(g, base);
        free_params(g, final);
        tr_geom_free(g);
    }
    free(g);
    tr_corpus_free(&corpus);
    return st != LPX_OK ? 1 : rc == 2 ? 2 : 0;
}
