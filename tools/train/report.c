/* The end of a `lpx train` run on stdout: the summary table of every
 * recipe run (loss, tokens/s, bytes on the wire, memory), and the dispatch
 * counts of the main recipe from the trace (fallbacks flagged). Kept out of
 * the rank loop (rank_loop.c), which only fills the tr_result rows. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "rank.h"
#include "metrics.h"
#include "mem.h"

static void mib(char *buf, size_t n, int64_t bytes) { snprintf(buf, n, "%.2f MiB", (double)bytes / 1048576.0); }

void tr_print_dispatch(const tr_opts *o)
{
    /* the trace counts this process's calls: every rank's with local
     * threads, rank 0's alone with one rank per process */
    printf("\ndispatch counts (from the trace, main recipe%s)\n",
           tr_per_process(o, NULL, NULL) ? ", rank 0's process" : "");
    printf("  %-26s %-10s %10s %10s\n", "op", "key", "calls", "fallbacks");
    int flagged = 0;
    for (int op = 0; op < lpx_op_count(); op++) {
        for (int key = 0; key < 64; key++) {
            uint64_t n = lpx_trace_count(op, key);
            if (!n) continue;
            uint64_t fb = lpx_trace_fallback_count(op, key);
            printf("  %-26s %-10s %10llu %10llu%s\n", lpx_op_name(op), lpx_key_name(key), (unsigned long long)n,
                   (unsigned long long)fb, fb ? "   <-- FALLBACK" : "");
            flagged += fb != 0;
        }
    }
    printf("  %s\n", flagged ? "fallbacks flagged above: those ops ran dequantized" : "no fallbacks: every op ran its own kernel");
}

void tr_print_summary(const tr_opts *o, const tr_geom *g, const tr_result *res, int nres, int main_idx,
                          int base_idx, const tr_mem_run *mr)
{
    const tr_result *M = &res[main_idx];
    printf("\n== summary: %d ranks (%s), dim %d, layers %d, heads %d (kv %d), ffn %d, vocab %d%s, seq %d, batch %d, "
           "%lld params%s ==\n", o->ranks, o->comm, g->dim, g->layers, g->heads, g->kv_heads, g->hidden, g->vocab,
           g->tied ? " (tied head)" : "", g->seq, o->batch, (long long)tr_geom_numel(g),
           o->ac ? ", activation checkpointing" : "");
    printf("  %-20s %10s %10s %10s %9s %8s\n", "recipe", "train", "val", "val gap", "tok/s", "time");
    for (int r = 0; r < nres; r++) {
        const tr_result *x = &res[r];
        double toks = 0;
        for (int s = 0; s < x->steps; s++) toks += x->rec[s].tok_s;
        char gap[32] = "-";
        if (base_idx >= 0 && r != base_idx && res[base_idx].val_loss > 0)
            snprintf(gap, sizeof gap, "%+.2f%%", 100.0 * (x->val_loss - res[base_idx].val_loss) / res[base_idx].val_loss);
        printf("  %-20s %10.4f %10.4f %10s %9.0f %7.1fs\n", x->label, x->train_loss, x->val_loss, gap,
               toks / x->steps, x->seconds);
    }
    /* where a step's time goes (steps after the first: no warm-up), and on
     * a GPU the share of the chip's bf16 peak the model's FLOPs reach */
    for (int r = 0; r < nres; r++) {
        const tr_result *x = &res[r];
        double c = 0, k = 0, a = 0, tok = 0;
        int n = 0;
        for (int s = x->start + 1; s < x->steps; s++, n++) {
            c += x->rec[s].compute_ms;
            k += x->rec[s].comm_ms;
            a += x->rec[s].optim_ms;
            tok += x->rec[s].tok_s;
        }
        if (!n) continue;
        printf("  %-20s step %.1f ms = compute %.1f + collectives %.1f + optimizer %.1f (mean of steps %d..%d)",
               x->label, (c + k + a) / n, c / n, k / n, a / n, x->start + 2, x->steps);
        if (x->gpu_peak >= 0) {
            /* model FLOPs per token as PaLM and torchtitan count them: 6 x
             * the matmul weights (every linear and the LM head) + 12 x
             * layers x dim x seq for attention's two products (no causal
             * halving) */
            double flop_tok = 6.0 * (double)tr_geom_matmul_params(g) + 12.0 * g->layers * (double)g->dim * g->seq;
            double mfu = flop_tok * (tok / n) / o->ranks / (TR_PEAK_BF16_TFLOPS * 1e12);
            printf("; MFU %.1f%% of %.0f TFLOP/s per GPU (the dense bf16 peak of an H100 SXM / H200)",
                   100 * mfu, TR_PEAK_BF16_TFLOPS);
        }
        printf("\n");
        if (x->gpu_peak >= 0) {
            /* lpx mem's device total for this run, beside the measured peak */
            tr_mem_est e;
            tr_mem_estimate_geom(g, x->recipe, o->ranks, o->lora_rank, o->batch / o->micro, o->micro / o->ranks,
                                 o->wrap_linear, tr_act_dtype(o, x->recipe) == LPX_F32 ? 4 : 2, o->ac, &e);
            int64_t host = o->offload ? e.params + e.optimizer : 0;
            int64_t dev = e.params + e.grads + e.optimizer + e.unsharded + e.activations + e.transient - host;
            printf("  %-20s peak GPU memory (rank 0, lpx-cuda's allocator over the steps): %.2f GiB; lpx mem's device "
                   "total %.2f GiB (%+.1f%%)\n", x->label, (double)x->gpu_peak / (1024.0 * 1048576.0),
                   (double)dev / (1024.0 * 1048576.0),
                   x->gpu_peak ? 100.0 * ((double)dev - (double)x->gpu_peak) / (double)x->gpu_peak : 0.0);
        }
    }
    if (M->optim_params) {
        static const char *const on[] = {"adamw", "adamw8bit", "adamw4bit", "adamw-fp8"};
        printf("  optimizer %s, master %s: state %.4f bytes/param (m + v%s), masters %.4f "
               "bytes/param (measured on rank 0's shards: %lld params)\n", on[o->optim & 3],
               tr_master_names[o->master >= 0 && o->master < TR_MASTERS ? o->master : 0], (double)M->optim_state_bytes / (double)M->optim_params,
               o->optim ? " with block scales" : ", f32", (double)M->optim_master_bytes / (double)M->optim_params,
               (long long)M->optim_params);
    }
    if (M->skipped || o->skip_nonfinite)
        printf("  optimizer steps skipped for non-finite gradients (--skip-nonfinite): %d\n", M->skipped);
    if (M->start) printf("  %s resumed at step %d (steps 1..%d from the checkpoint)\n", M->label, M->start, M->start);
    if (M->recipe == TR_NF4_QLORA) {
        printf("  nf4-qlora: val loss of the pre-trained base %.4f -> %.4f after adapter training\n",
               M->val_loss_start, M->val_loss);
        printf("  nf4 base weights: %lld bytes for %lld params = %.3f bits/param; trainable (adapters): %lld\n",
               (long long)M->nf4_bytes, (long long)M->nf4_numel,
               M->nf4_numel ? 8.0 * (double)M->nf4_bytes / (double)M->nf4_numel : 0.0, (long long)M->trainable);
    }
    printf("\ncollectives per step (rank 0, last step, from lpx_fsdp_stats)\n");
    printf("  %-20s %12s %12s %12s %12s\n", "recipe", "all-gather", "bytes", "reduce-scat", "bytes");
    for (int r = 0; r < nres; r++) {
        const tr_result *x = &res[r];
        printf("  %-20s %12llu %12llu %12llu %12llu   all-reduce %llu (%llu B)\n", x->label,
               (unsigned long long)x->coll_calls[LPX_COLL_ALL_GATHER],
               (unsigned long long)x->coll_bytes[LPX_COLL_ALL_GATHER],
               (unsigned long long)x->coll_calls[LPX_COLL_REDUCE_SCATTER],
               (unsigned long long)x->coll_bytes[LPX_COLL_REDUCE_SCATTER],
               (unsigned long long)x->coll_calls[LPX_COLL_ALL_REDUCE],
               (unsigned long long)x->coll_bytes[LPX_COLL_ALL_REDUCE]);
    }
    if (base_idx >= 0 && res[base_idx].coll_bytes[LPX_COLL_ALL_GATHER] && M->coll_bytes[LPX_COLL_ALL_GATHER])
        printf("  all-gather bytes %s / bf16 = %.3f\n", M->label,
               (double)M->coll_bytes[LPX_COLL_ALL_GATHER] / (double)res[base_idx].coll_bytes[LPX_COLL_ALL_GATHER]);
    if (M->recipe == TR_F8_TENSORWISE)
        printf("  amax all-reduces per step: %llu (lpx_fsdp_precompute_scales: all fp8 weight scales in one call)\n",
               (unsigned long long)M->amax_allreduces);
    for (int r = 0; r < nres; r++)
        printf("  %-20s unshards per step %llu, peak unsharded %d groups / %.2f MiB (lpx_fsdp_stats)\n",
               res[r].label, (unsigned long long)res[r].unshards, res[r].peak_unsharded_groups,
               (double)res[r].peak_unsharded / 1048576.0);

    printf("\npeak memory per rank (rank 0): the trainer's count of the tensors it owns, by category, vs `lpx mem`\n"
           "  (both are computed from the same shapes, so they agree by construction; the process's real peak is\n"
           "  below)\n");
    printf("  %-20s %-12s %-12s %-12s %-12s %-12s\n", "recipe", "params", "grads", "optimizer", "unsharded",
           "activations");
    for (int r = 0; r < nres; r++) {
        const tr_result *x = &res[r];
        tr_mem_est e;
        tr_mem_estimate_geom(g, x->recipe, o->ranks, o->lora_rank, o->batch / o->micro, o->micro / o->ranks,
                             o->wrap_linear, tr_act_dtype(o, x->recipe) == LPX_F32 ? 4 : 2, o->ac, &e);
        int64_t meas[5] = {x->mem_peak[TR_MEM_PARAMS], x->mem_peak[TR_MEM_GRADS], x->mem_peak[TR_MEM_OPT],
                           x->mem_peak[TR_MEM_UNSHARDED], x->mem_peak[TR_MEM_ACT]};
        int64_t est[5] = {e.params, e.grads, e.optimizer, e.unsharded, e.activations};
        char c[5][24];
        for (int k = 0; k < 5; k++) mib(c[k], sizeof c[k], meas[k]);
        printf("  %-20s %-12s %-12s %-12s %-12s %-12s counted\n", x->label, c[0], c[1], c[2], c[3], c[4]);
        double worst = 0;
        for (int k = 0; k < 5; k++) {
            mib(c[k], sizeof c[k], est[k]);
            double d = meas[k] ? fabs((double)est[k] - (double)meas[k]) / (double)meas[k] : (est[k] ? 1.0 : 0.0);
            worst = d > worst ? d : worst;
        }
        printf("  %-20s %-12s %-12s %-12s %-12s %-12s estimate (worst %.1f%% off)\n", "", c[0], c[1], c[2], c[3],
               c[4], 100 * worst);
    }

    /* the process's real peak against lpx mem's process estimate: every
     * phase's ranks x per-rank total + the model copies + the corpus + the
     * modelled overhead; the peak is the largest phase's */
    tr_mem_phase ph[3];
    int np = tr_mem_phases(o, g, mr, ph);
    double est = 0, rss = tr_mem_peak_rss();
    const char *at = "";
    for (int i = 0; i < np; i++)
        if (ph[i].total > est) est = ph[i].total, at = ph[i].label;
    const double MiB = 1048576.0;
    printf("\nprocess memory (host; %s): real peak RSS %.1f MiB (VmHWM), lpx mem's process estimate %.1f MiB (%s "
           "phase, %+.1f%%)\n", !strcmp(o->device, "cuda") ? "the GPU's memory is above" : "every rank's tensors",
           rss / MiB, est / MiB, at, rss > 0 ? 100.0 * (est - rss) / rss : 0.0);
    for (int i = 0; i < np; i++)
        printf("  %-20s estimate %.1f MiB = %d ranks x %.1f MiB (lpx mem's per-rank total) + %.1f MiB f32 model "
               "copies + %.1f MiB corpus + %.1f MiB overhead\n", ph[i].label, ph[i].total / MiB, ph[i].ranks,
               ph[i].per_rank / MiB, ph[i].weights / MiB, ph[i].corpus / MiB, ph[i].overhead / MiB);
    /* (no "loss " in these lines: tests read the progress lines' losses as "  LABEL ... loss X") */
    printf("  not in the categories above: the LM head's chunk of logits, their grad and the head's grad (in lpx\n"
           "  mem's per-rank total), the initial weights, the corpus, and the modelled overhead: OpenBLAS's\n"
           "  per-thread buffers, f32<->bf16 conversions of GEMM operands, the dispatcher's temporaries, the\n"
           "  allocator's arenas and slack, the executable\n");
}

