/* AdamW through the engine: lpx_fsdp_adamw_step runs one fused pass per
 * parameter over this rank's local shards (f32 m and v, 8 bytes per local
 * trainable element, allocated by the engine at the first step). Frozen
 * params (the NF4 base, nf4-qlora's embeddings/norms/head) are skipped;
 * LPX_FSDP_NO_DECAY params (norms, embeddings, adapters) get no weight
 * decay. */
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

lpx_status tr_adamw_setup(tr_rank *R)
{
    (void)R; /* the engine allocates m and v (counted in shard.c) */
    return LPX_OK;
}

void tr_adamw_teardown(tr_rank *R) { (void)R; }

lpx_status tr_adamw_step(tr_rank *R, double lr)
{
    lpx_adamw_opts ao = {.lr = lr, .beta1 = BETA1, .beta2 = BETA2, .eps = EPS, .weight_decay = WEIGHT_DECAY};
    for (int grp = 0; grp < R->g->ngroups; grp++) {
        bool trainable = false;
        for (int p = 0; p < R->g->nparams; p++)
            if (R->g->p[p].group == grp && (R->recipe != TR_NF4_QLORA || R->g->p[p].kind == TR_P_LIN))
                trainable = true;
        if (!trainable) continue;
        lpx_status st = lpx_fsdp_adamw_step(R->grp[grp], &ao);
        if (st != LPX_OK) return st;
    }
    return LPX_OK;
}
