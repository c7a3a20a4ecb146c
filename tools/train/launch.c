/* `lpx train`: the launcher. lpx_cmd_train parses the options, opens
 * --resume's checkpoint, then refuses with one line and exit 2 what this
 * build or machine cannot do: --device cuda/sim (check_cuda, check_sim),
 * the world (world.c), fault injections out of range, every output path,
 * --init's Hugging Face folder; and a model too big for this machine
 * (tr_fits_memory, called by run.c once the geometry is known). The run
 * itself: run.c. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "rank.h"
#include "mem.h"
#include "outfile.h"
#include "hf.h"
#include "../lpx/commands.h"
#include "lpx/cuda.h"
#include "lpx/plugin.h"

static int train_run(tr_opts *op, const tr_ckpt *ck);

/* A model too big for this machine is refused before anything is
 * allocated: every phase the run goes through (nf4-qlora's bf16
 * pre-training, the recipe, --compare's bf16 run), each the `lpx mem`
 * estimate of every rank (the local ranks share this process), the f32
 * model copies, the corpus and the modelled overhead (tr_mem_phases),
 * against the memory available now (MemAvailable, the cgroup's room). */
bool tr_fits_memory(const tr_opts *o, const tr_geom *g, bool lead, const tr_mem_run *mr)
{
    tr_mem_phase ph[3];
    int n = tr_mem_phases(o, g, mr, ph);
    tr_host_mem hm;
    tr_host_mem_read(&hm);
    for (int i = 0; i < n; i++) {
        if (ph[i].total <= hm.avail) continue;
        if (lead) {
            char have[320], need[32], rank[32], wc[32], ov[32];
            tr_host_mem_describe(&hm, have, sizeof have);
            tr_mem_human(need, sizeof need, ph[i].total);
            tr_mem_human(rank, sizeof rank, ph[i].per_rank);
            tr_mem_human(wc, sizeof wc, ph[i].weights + ph[i].corpus);
            tr_mem_human(ov, sizeof ov, ph[i].overhead);
            fprintf(stderr, "lpx train: the model (%lld params) needs about %s here in its %s phase (lpx mem: %s per "
                    "rank x %d ranks, plus %s of weights and corpus and %s of process overhead); this machine has %s\n",
                    (long long)tr_geom_numel(g), need, ph[i].label, rank, ph[i].ranks, wc, ov, have);
        }
        return false;
    }
    return true;
}

int lpx_cmd_train(int argc, char **argv)
{
    tr_opts o;
    bool help;
    int rc = tr_parse_train(argc, argv, &o, &help);
    if (help) {
        tr_train_usage(stdout);
        return 0;
    }
    if (rc) return rc;
    tr_ckpt ck;
    memset(&ck, 0, sizeof ck);
    if (o.resume_dir) {
        /* the manifest and every file's checksum first; then the options
         * not given on the command line come from it */
        if (tr_ckpt_open(o.resume_dir, &ck) != LPX_OK) {
            fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
        if ((rc = tr_ckpt_apply(&ck, &o))) {
            tr_ckpt_free(&ck);
            return rc;
        }
    }
    rc = train_run(&o, o.resume_dir ? &ck : NULL);
    tr_ckpt_free(&ck);
    return rc;
}

/* --device cuda: lpx-cuda.so with a GPU (loaded from LPX_PLUGIN_PATH or
 * next to this executable, then lpx-nccl.so needs it), and what the GPU
 * path does not do yet; 0, or 2 after one line */
static int check_cuda(const tr_opts *o)
{
    char why[600] = "";
    if (!lpx_backend_for(LPX_DEVICE_CUDA) && !lpx_tool_load_shipped("backends/cuda", "lpx-cuda.so"))
        snprintf(why, sizeof why, "%s", lpx_last_error());   /* e.g. the plugin declined: no driver or GPU */
    lpx_clear_error();
    lpx_cuda_device_count_fn count = NULL;
    void *sym = lpx_tool_plugin_fn("cuda", LPX_CUDA_SYM_DEVICE_COUNT);
    memcpy(&count, &sym, sizeof sym);
    int n = count ? count() : 0;
    if (!lpx_backend_for(LPX_DEVICE_CUDA) || n <= 0) {
        if (lpx_backend_for(LPX_DEVICE_CUDA)) fprintf(stderr, "lpx train: --device cuda: lpx-cuda.so sees no GPU\n");
        else if (why[0]) fprintf(stderr, "lpx train: --device cuda: no CUDA backend: %s\n", why);
        else fprintf(stderr, "lpx train: --device cuda: no CUDA backend is loaded (lpx-cuda.so: build with CUDA, or "
                             "set LPX_PLUGIN_PATH to its directory)\n");
        return 2;
    }
    if (!tr_per_process(o, NULL, NULL) && o->ranks > n) {
        fprintf(stderr, "lpx train: --device cuda --ranks %d: this machine has %d GPU%s (one rank per GPU)\n",
                o->ranks, n, n == 1 ? "" : "s");
        return 2;
    }
    if (o->save_dir || o->resume_dir || o->save_hf || o->init_path) {
        fprintf(stderr, "lpx train: --device cuda: %s is not available on the GPU yet (the checkpoint and import "
                        "code reads host shards and agrees over host buffers, which NCCL refuses)\n",
                o->save_dir ? "--save" : o->resume_dir ? "--resume" : o->save_hf ? "--save-hf" : "--init");
        return 2;
    }
    return 0;
}

/* --device sim: lpx-simdev.so (from LPX_PLUGIN_PATH or next to this
 * executable), a device per rank, and what the device path does not do
 * yet (as on a GPU); 0, or 2 after one line */
static int check_sim(const tr_opts *o)
{
    if (!lpx_backend_for(LPX_DEVICE_SIM) && !lpx_tool_load_shipped("backends/simdev", "lpx-simdev.so")) {
        fprintf(stderr, "lpx train: --device sim: lpx-simdev.so is not loaded (%s)\n", lpx_last_error());
        return 2;
    }
    if (o->ranks > 8) {
        fprintf(stderr, "lpx train: --device sim --ranks %d: there are 8 simulated devices (one rank per device)\n",
                o->ranks);
        return 2;
    }
    if (tr_recipe_is_mx(o->recipe)) {
        fprintf(stderr, "lpx train: --device sim --recipe %s: the MX formats run on the CPU and on CUDA "
                        "(lpx-mx-cuda.so), not on the simulated device\n", tr_recipe_name(o->recipe));
        return 2;
    }
    if (o->save_dir || o->resume_dir || o->save_hf || o->init_path) {
        fprintf(stderr, "lpx train: --device sim: %s is not available on a device yet (as on a GPU: the checkpoint and "
                        "import code reads host shards)\n",
                o->save_dir ? "--save" : o->resume_dir ? "--resume" : o->save_hf ? "--save-hf" : "--init");
        return 2;
    }
    return 0;
}

static int train_run(tr_opts *op, const tr_ckpt *ck)
{
    tr_opts o = *op;

    /* refuse what this build cannot do with one line and exit 2. A comm
     * backend's plugin (lpx-mpi.so) comes through LPX_PLUGIN_PATH or from
     * next to this executable, as lpx-mx.so does. */
    if (!strcmp(o.device, "cuda") || !strcmp(o.device, "sim")) {
        int rc = !strcmp(o.device, "cuda") ? check_cuda(&o) : check_sim(&o);
        if (rc) return rc;
    }
    /* the comm backend and the world (world.c); lead: this process prints
     * and writes the files */
    bool lead = true;
    int wrc = tr_world(&o, &lead);
    if (wrc) return wrc;
    if (o.inject_comm_step && o.inject_comm_rank >= o.ranks) {
        if (lead) fprintf(stderr, "lpx train: --inject-comm-fault %d:%d: there are %d ranks\n", o.inject_comm_step,
                          o.inject_comm_rank, o.ranks);
        return 2;
    }
    if (tr_recipe_is_mx(o.recipe)) {
        const lpx_kind *k;
        if (tr_mx_kind(o.recipe, &k) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
    }

    /* every output path is checked before the first step, not after the run */
    if (o.save_dir && tr_ckpt_check_target(o.save_dir) != LPX_OK) {
        if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
        return 2;
    }
    /* --out and --save-hf: directories (or absent, with a writable parent)
     * whose files may be written: a FIFO or a device there is refused now */
    static const char *const out_files[] = {"metrics.csv", "loss.svg"};
    static const char *const hf_files[] = {"config.json", "model.safetensors"};
    /* nf4-qlora pre-trains its base and saves it as OUT/base (Hugging Face) */
    char base_dir[1200];
    snprintf(base_dir, sizeof base_dir, "%s/base", o.out_dir);
    struct stat ost;
    bool base_out = o.recipe == TR_NF4_QLORA && !ck && !o.init_path && stat(o.out_dir, &ost) == 0 &&
                    S_ISDIR(ost.st_mode);
    if (tr_check_out_dir("--out", o.out_dir, out_files, 2) != LPX_OK ||
        (base_out && tr_check_out_dir("--out", base_dir, hf_files, 2) != LPX_OK) ||
        (o.save_hf && tr_check_out_dir("--save-hf", o.save_hf, hf_files, 2) != LPX_OK) ||
        tr_check_output_clash(o.save_dir, o.out_dir, o.save_hf, o.init_path) != LPX_OK) {
        if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
        return 2;
    }
    /* --init DIR: a Hugging Face model directory sets the model */
    struct stat ist;
    bool hf_init = o.init_path && stat(o.init_path, &ist) == 0 && S_ISDIR(ist.st_mode);
    if (hf_init) {
        const unsigned arch_given = TR_GIVEN_MODEL | TR_GIVEN_DIM | TR_GIVEN_LAYERS | TR_GIVEN_HEADS |
                                    TR_GIVEN_KV_HEADS | TR_GIVEN_FFN | TR_GIVEN_VOCAB | TR_GIVEN_ROPE_THETA |
                                    TR_GIVEN_TIED;
        if (o.given & arch_given) {
            if (lead) fprintf(stderr, "lpx train: --init '%s' sets the model from its config.json; leave out --model, "
                              "--dim, --layers, --heads, --kv-heads, --ffn, --vocab, --rope-theta and --tied\n",
                              o.init_path);
            return 2;
        }
        if (tr_hf_config(o.init_path, &o.m) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
        if (tr_arch_check(&o.m, "lpx train")) return 2;
        /* the tokenizer and the other files --save-hf copies: a different
         * file of the user's there is refused now, not after the run */
        if (o.save_hf && tr_hf_check_copy(o.init_path, o.save_hf, lead ? stderr : NULL) != LPX_OK) {
            if (lead) fprintf(stderr, "lpx train: %s\n", lpx_last_error());
            return 2;
        }
    } else if (o.init_path) {
        if (lead) fprintf(stderr, "lpx train: --init '%s' is not a directory: every recipe starts from a Hugging Face "
                          "model directory (nf4-qlora's pre-trained base is one: OUT/base)\n", o.init_path);
        return 2;
    }

    return tr_train_run(&o, ck, lead, hf_init);
}
