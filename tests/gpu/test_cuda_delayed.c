/* Delayed scaling on the GPU (issue 32, "Delayed scaling on the GPU"; the
 * known bug: the cast's statistics stayed on the device and
 * lpx_float8_delayed_update received NaN, so the scale never moved).
 *
 * Eight steps of lpx_float8_quantize with a delayed state (history 4,
 * max over the window) on the GPU beside the same steps on the CPU, the
 * input's magnitude changing every step (up, then down, so the window's
 * max drops out): after each step the scale and the amax history equal
 * the CPU's bit for bit, the cast's bytes and its statistics are equal,
 * and the scale moves (it differs from the previous step's at least once
 * after the window fills). Prints one line per step and the summary
 * line bench/gpu/acceptance.py reads:
 *   delayed-scaling: steps=8 moved=M equal=yes|no final_scale=X
 * Without a GPU: skipped (77), like the rest of the suite. */
#include "gpu_util.h"

#define STEPS 8
#define HIST 4

/* the same bytes, a float8 tensor's inner tensors included */
static bool same_tensor(lpx_tensor *cpu, lpx_tensor *gpu)
{
    if (!cpu || !gpu || lpx_tensor_kind(cpu) != lpx_tensor_kind(gpu)) return false;
    if (lpx_tensor_kind(cpu)) {
        if (lpx_tensor_inner_count(cpu) != lpx_tensor_inner_count(gpu)) return false;
        for (int i = 0; i < lpx_tensor_inner_count(cpu); i++)
            if (!same_tensor(lpx_tensor_inner(cpu, i), lpx_tensor_inner(gpu, i))) return false;
        return true;
    }
    return gpu_same_bits("delayed cast", cpu, gpu);
}

static void test_delayed_scale_moves_and_matches_cpu(void)
{
    static const double mag[STEPS] = {1.0, 2.0, 4.0, 8.0, 3.0, 0.5, 0.25, 0.125};
    int64_t s[2] = {256, 384};
    lpx_float8_delayed_config cfg = {.history_len = HIST};
    lpx_float8_delayed *hd = NULL, *dd = NULL;
    CHECK_OK(lpx_float8_delayed_new(&cfg, &hd));
    CHECK_OK(lpx_float8_delayed_new(&cfg, &dd));
    int moved = 0;
    bool equal = true;
    float prev = 1.0f;
    for (int step = 0; hd && dd && step < STEPS; step++) {
        lpx_tensor *x = rand_normal(2, s, 900 + (uint64_t)step, mag[step], LPX_BF16), *gx = gpu_up(x);
        lpx_tensor *qh = NULL, *qd = NULL;
        lpx_float8_quant_opts oh = {.struct_size = sizeof oh, .delayed = hd},
                              od = {.struct_size = sizeof od, .delayed = dd};
        lpx_float8_stats sh_st, sd_st;
        memset(&sh_st, 0, sizeof sh_st);
        memset(&sd_st, 0, sizeof sd_st);
        CHECK_OK(lpx_float8_quantize(x, &oh, &qh, &sh_st));
        CHECK_OK(lpx_float8_quantize(gx, &od, &qd, &sd_st));
        bool same_q = same_tensor(qh, qd);
        CHECKF(same_q, "step %d: the delayed cast on the GPU differs from the CPU's", step);
        float sh = lpx_float8_delayed_scale(hd), sd = lpx_float8_delayed_scale(dd);
        bool same_s = !memcmp(&sh, &sd, sizeof sh);
        CHECKF(same_s && sd == sd, "step %d: scale on the GPU %.9g, CPU %.9g (NaN: the device amax never reached the "
               "history)", step, (double)sd, (double)sh);
        float h1[HIST] = {0}, h2[HIST] = {0};
        int n1 = lpx_float8_delayed_history(hd, h1, HIST), n2 = lpx_float8_delayed_history(dd, h2, HIST);
        bool same_h = n1 == n2 && !memcmp(h1, h2, sizeof h1);
        CHECKF(same_h, "step %d: amax history on the GPU %g, CPU %g", step, (double)h2[0], (double)h1[0]);
        bool same_st = !memcmp(&sh_st, &sd_st, sizeof sh_st);
        CHECKF(same_st, "step %d: the cast's statistics differ on the GPU", step);
        equal = equal && same_q && same_s && same_h && same_st;
        if (memcmp(&sd, &prev, sizeof sd)) moved++;
        prev = sd;
        printf("  delayed step %d: |x| ~ %g, scale gpu %.9g cpu %.9g, newest amax gpu %.9g cpu %.9g%s\n", step + 1,
               mag[step], (double)sd, (double)sh, (double)h2[0], (double)h1[0], same_s && same_h ? "" : "  DIFFERS");
        lpx_tensor *rel[] = {x, gx, qh, qd};
        for (int i = 0; i < 4; i++) lpx_tensor_release(rel[i]);
    }
    /* scale 1 at first; the window's max rises over steps 1-4 and falls
     * once step 4's amax drops out (step 8): at least 5 moves */
    CHECKF(moved >= 5, "the delayed scale moved %d times in %d steps (expected at least 5)", moved, STEPS);
    printf("delayed-scaling: steps=%d moved=%d equal=%s final_scale=%.9g\n", STEPS, moved, equal ? "yes" : "no",
           (double)prev);
    lpx_float8_delayed_free(hd);
    lpx_float8_delayed_free(dd);
}

int main(void)
{
    gpu_setup();
    RUN(test_delayed_scale_moves_and_matches_cpu);
    return CHECK_DONE();
}
