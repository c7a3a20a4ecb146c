/* AdamW on this rank's shards (or, for nf4-qlora, on the adapters only).
 * A plain loop over f32 buffers: every rank updates exactly the elements
 * it owns, so sharded optimizer state is 2 x 4 bytes per local element. */
#include <math.h>
#include "rank.h"

#define BETA1 0.9
#define BETA2 0.95
#define EPS 1e-8
#define WEIGHT_DECAY 0.1

double tr_lr_at(const tr_opts *o, int step, int steps)
{
    /* linear warmup over the first 5% of steps, then cosine down to 10% */
    int warm = steps / 20 > 1 ? steps / 20 : 1;
    if (step < warm) return o->lr * (step + 1) / warm;
    double t = steps > warm ? (double)(step - warm) / (double)(steps - warm) : 1.0;
    return o->lr * (0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * t)));
}

static lpx_status zeros_like(tr_rank *R, lpx_tensor *t, lpx_tensor **out)
{
    lpx_status st = lpx_zeros(lpx_tensor_ndim(t), lpx_tensor_shape(t), LPX_F32, lpx_cpu(), out);
    if (st == LPX_OK) tr_mem_add(&R->mem, TR_MEM_OPT, tr_tensor_bytes(*out));
    return st;
}

lpx_status tr_adamw_setup(tr_rank *R)
{
    lpx_status st = LPX_OK;
    for (int p = 0; p < R->g->nparams; p++) {
        if (R->recipe == TR_NF4_QLORA) {
            if (!R->la[p]) continue;
            TRY(zeros_like(R, R->la[p], &R->ma[p]));
            TRY(zeros_like(R, R->la[p], &R->va[p]));
            TRY(zeros_like(R, R->lb[p], &R->mb[p]));
            TRY(zeros_like(R, R->lb[p], &R->vb[p]));
        } else {
            TRY(zeros_like(R, R->master[p], &R->m[p]));
            TRY(zeros_like(R, R->master[p], &R->v[p]));
        }
    }
out:
    return st;
}

void tr_adamw_teardown(tr_rank *R)
{
    for (int p = 0; p < R->g->nparams; p++) {
        REL(R->m[p]);
        REL(R->v[p]);
        REL(R->ma[p]);
        REL(R->va[p]);
        REL(R->mb[p]);
        REL(R->vb[p]);
    }
}

static void adamw(float *w, float *g, float *m, float *v, int64_t n, double lr, double wd, double bc1, double bc2)
{
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i];
        m[i] = (float)(BETA1 * m[i] + (1 - BETA1) * gi);
        v[i] = (float)(BETA2 * v[i] + (1 - BETA2) * gi * gi);
        double upd = (m[i] / bc1) / (sqrt(v[i] / bc2) + EPS);
        w[i] = (float)(w[i] - lr * (upd + wd * w[i]));
    }
}

lpx_status tr_adamw_step(tr_rank *R, double lr)
{
    R->adam_t++;
    double bc1 = 1 - pow(BETA1, (double)R->adam_t), bc2 = 1 - pow(BETA2, (double)R->adam_t);
    for (int p = 0; p < R->g->nparams; p++) {
        if (R->recipe == TR_NF4_QLORA) {
            if (!R->la[p]) continue;
            lpx_tensor *w[2] = {R->la[p], R->lb[p]}, *g[2] = {R->ga[p], R->gb[p]};
            lpx_tensor *m[2] = {R->ma[p], R->mb[p]}, *v[2] = {R->va[p], R->vb[p]};
            for (int i = 0; i < 2; i++) {
                adamw(lpx_tensor_data(w[i]), lpx_tensor_data(g[i]), lpx_tensor_data(m[i]), lpx_tensor_data(v[i]),
                      lpx_tensor_numel(w[i]), lr, 0.0, bc1, bc2);
                lpx_status st = lpx_fill_(g[i], 0.0); /* the next step accumulates from zero */
                if (st != LPX_OK) return st;
            }
        } else {
            adamw(lpx_tensor_data(R->master[p]), lpx_tensor_data(R->gshard[p]), lpx_tensor_data(R->m[p]),
                  lpx_tensor_data(R->v[p]), lpx_tensor_numel(R->master[p]), lr,
                  R->g->p[p].decay ? WEIGHT_DECAY : 0.0, bc1, bc2);
        }
    }
    return LPX_OK;
}
