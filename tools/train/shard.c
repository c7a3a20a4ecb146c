/* Parameter sharding over lpx_comm (FSDP-style, dim-0 chunks).
 *
 * Every parameter's f32 master is cut along dim 0 with torch.chunk
 * semantics (chunk = ceil(rows / world); trailing shards smaller or empty,
 * padded on the wire). Per shard group:
 *   unshard   cast each shard to its wire dtype (fp8 with the replicated
 *             scale for float8-tensorwise linears, bf16 otherwise), pack
 *             all of the group into one u8 buffer, ONE all-gather, unpack
 *             into the compute form (a float8 tensor, bf16, or MX)
 *   reshard   drop the unsharded weights
 *   reduce    pack the group's full f32 grads per destination rank, ONE
 *             reduce-scatter (sum, in rank order), unpack into grad shards
 *   scales    after the optimizer step: every fp8 weight's local amax in one
 *             buffer, ONE all-reduce(MAX), scale = 448 / amax, so the next
 *             unshard needs no other collective
 * The unsharded weights of a group live from its first use in the forward
 * to its last use in the backward (reshard_after_forward = false): the
 * float8 linear contexts hold the fp8 weight for the backward GEMM, so a
 * group is gathered once per step. */
#include <stdlib.h>
#include <string.h>
#include "rank.h"

void tr_mem_add(tr_memtrack *m, int cat, int64_t bytes)
{
    m->cur[cat] += bytes;
    if (m->cur[cat] > m->peak[cat]) m->peak[cat] = m->cur[cat];
}

int64_t tr_tensor_bytes(const lpx_tensor *t)
{
    if (!t) return 0;
    if (!lpx_tensor_kind(t)) return (int64_t)lpx_dtype_nbytes(lpx_tensor_dtype(t), lpx_tensor_numel(t));
    int64_t n = 0;
    for (int i = 0; i < lpx_tensor_inner_count(t); i++) n += tr_tensor_bytes(lpx_tensor_inner(t, i));
    return n;
}

static int wire_size(const tr_rank *R, int p) { return R->fp8_wire[p] ? 1 : 2; }

static bool is_1d(const tr_param *p) { return p->kind == TR_P_NORM || p->kind == TR_P_NORMF; }

lpx_status tr_shard_setup(tr_rank *R, float *const *init)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    R->sharded = R->recipe != TR_NF4_QLORA;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        int64_t rows = P->rows, cols = P->cols;
        if (R->sharded) {
            R->chunk[p] = (rows + R->world - 1) / R->world;
            int64_t s = R->chunk[p] * R->rank;
            R->start[p] = s < rows ? s : rows;
            R->len[p] = rows - R->start[p] < R->chunk[p] ? rows - R->start[p] : R->chunk[p];
        } else {
            R->chunk[p] = rows;
            R->start[p] = 0;
            R->len[p] = rows;
        }
        R->fp8_wire[p] = R->recipe == TR_F8_TENSORWISE && P->kind == TR_P_LIN;
        int64_t shape[2] = {R->len[p], cols};
        int nd = (!R->sharded && is_1d(P)) ? 1 : 2;
        TRY(lpx_empty(nd, shape, LPX_F32, lpx_cpu(), &R->master[p]));
        memcpy(lpx_tensor_data(R->master[p]), init[p] + R->start[p] * cols, sizeof(float) * (size_t)(R->len[p] * cols));
        tr_mem_add(&R->mem, TR_MEM_PARAMS, tr_tensor_bytes(R->master[p]));
        if (R->sharded) {
            TRY(lpx_zeros(2, shape, LPX_F32, lpx_cpu(), &R->gshard[p]));
            tr_mem_add(&R->mem, TR_MEM_GRADS, tr_tensor_bytes(R->gshard[p]));
        } else if (P->kind != TR_P_LIN) {
            /* a frozen replica is its own compute form */
            lpx_tensor_retain(R->master[p]);
            R->full[p] = R->master[p];
        }
    }
    if (!R->sharded)
        for (int i = 0; i < g->ngroups; i++) R->unsharded[i] = true;
out:
    return st;
}

void tr_shard_teardown(tr_rank *R)
{
    for (int p = 0; p < R->g->nparams; p++) {
        REL(R->master[p]);
        REL(R->gshard[p]);
        REL(R->full[p]);
        REL(R->full_dense[p]);
        REL(R->gacc[p]);
    }
}

lpx_status tr_need(tr_rank *R, int p)
{
    int grp = R->g->p[p].group;
    return R->unsharded[grp] ? LPX_OK : tr_unshard(R, grp);
}

/* rows of parameter p that rank r holds */
static int64_t rows_of(const tr_rank *R, int p, int r)
{
    int64_t s = R->chunk[p] * r, rows = R->g->p[p].rows;
    if (s >= rows) return 0;
    return rows - s < R->chunk[p] ? rows - s : R->chunk[p];
}

lpx_status tr_unshard(tr_rank *R, int grp)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    uint8_t *send = NULL, *recv = NULL;
    lpx_tensor *scale = NULL, *q = NULL, *data = NULL, *dense = NULL;
    size_t S = 0;
    if (R->unsharded[grp]) return LPX_OK;
    for (int p = 0; p < g->nparams; p++)
        if (g->p[p].group == grp) S += (size_t)(R->chunk[p] * g->p[p].cols * wire_size(R, p));
    send = calloc(S ? S : 1, 1);
    recv = malloc(S * (size_t)R->world + 1);
    if (!send || !recv) FAIL(LPX_ENOMEM, "train: out of memory for the all-gather buffers");
    tr_mem_add(&R->mem, TR_MEM_UNSHARDED, (int64_t)(S * (size_t)(R->world + 1)));

    size_t off = 0;
    for (int p = 0; p < g->nparams; p++) {
        if (g->p[p].group != grp) continue;
        int64_t n = R->len[p] * g->p[p].cols;
        if (n > 0 && R->fp8_wire[p]) {
            /* the pre-all-gather cast: fp8 with the replicated scale */
            TRY(lpx_full(0, NULL, R->f8scale[p], LPX_F32, lpx_cpu(), &scale));
            TRY(lpx_fp8_quantize(R->master[p], scale, LPX_F8E4M3FN, NULL, false, 0, true, &q, NULL, NULL, NULL));
            memcpy(send + off, lpx_tensor_data(q), (size_t)n);
            REL(q);
            REL(scale);
        } else if (n > 0) {
            TRY(lpx_convert(send + off, LPX_BF16, lpx_tensor_data(R->master[p]), LPX_F32, (size_t)n, 0));
        }
        off += (size_t)(R->chunk[p] * g->p[p].cols * wire_size(R, p));
    }

    TRY(lpx_comm_all_gather_buf(R->comm, send, recv, S));

    off = 0;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (P->group != grp) continue;
        int ws = wire_size(R, p);
        int64_t shape[2] = {P->rows, P->cols};
        lpx_dtype wdt = R->fp8_wire[p] ? LPX_F8E4M3FN : LPX_BF16;
        TRY(lpx_empty(2, shape, wdt, lpx_cpu(), &data));
        uint8_t *dst = lpx_tensor_data(data);
        for (int r = 0; r < R->world; r++)
            memcpy(dst + (size_t)(r * R->chunk[p] * P->cols * ws), recv + (size_t)r * S + off,
                   (size_t)(rows_of(R, p, r) * P->cols * ws));
        off += (size_t)(R->chunk[p] * P->cols * ws);

        if (R->fp8_wire[p]) {
            /* post-all-gather: wrap the gathered bytes with the same scale */
            TRY(lpx_full(0, NULL, R->f8scale[p], LPX_F32, lpx_cpu(), &scale));
            TRY(lpx_float8_from_data(data, scale, LPX_F32, LPX_FLOAT8_ROLE_WEIGHT, LPX_FLOAT8_TENSORWISE, -1,
                                     &R->full[p]));
            REL(scale);
        } else if (P->kind == TR_P_LIN && tr_recipe_is_mx(R->recipe)) {
            TRY(lpx_cast(data, LPX_F32, false, &R->full_dense[p]));
            TRY(lpx_kind_from_dense(R->mx_kind, R->full_dense[p], &R->full[p]));
        } else if (P->kind == TR_P_LIN) {
            /* bf16 weights go to the GEMMs as they are */
            lpx_tensor_retain(data);
            R->full[p] = data;
        } else {
            /* embeddings, norms and the head compute in f32 */
            TRY(lpx_cast(data, LPX_F32, false, &dense));
            if (is_1d(P)) {
                int64_t d1 = P->rows;
                TRY(lpx_view(dense, 1, &d1, &R->full[p]));
                REL(dense);
            } else {
                R->full[p] = dense;
                dense = NULL;
            }
        }
        REL(data);
        tr_mem_add(&R->mem, TR_MEM_UNSHARDED, tr_tensor_bytes(R->full[p]) + tr_tensor_bytes(R->full_dense[p]));
    }
    R->unsharded[grp] = true;
out:
    if (send) tr_mem_add(&R->mem, TR_MEM_UNSHARDED, -(int64_t)(S * (size_t)(R->world + 1)));
    free(send);
    free(recv);
    lpx_tensor_release(scale);
    lpx_tensor_release(q);
    lpx_tensor_release(data);
    lpx_tensor_release(dense);
    return st;
}

void tr_reshard(tr_rank *R, int grp)
{
    if (!R->sharded || !R->unsharded[grp]) return;
    for (int p = 0; p < R->g->nparams; p++) {
        if (R->g->p[p].group != grp) continue;
        tr_mem_add(&R->mem, TR_MEM_UNSHARDED, -(tr_tensor_bytes(R->full[p]) + tr_tensor_bytes(R->full_dense[p])));
        REL(R->full[p]);
        REL(R->full_dense[p]);
    }
    R->unsharded[grp] = false;
}

lpx_status tr_reduce_grads(tr_rank *R, int grp)
{
    lpx_status st = LPX_OK;
    const tr_geom *g = R->g;
    size_t count = 0;
    for (int p = 0; p < g->nparams; p++)
        if (g->p[p].group == grp) count += (size_t)(R->chunk[p] * g->p[p].cols);
    int64_t sbytes = (int64_t)(count * (size_t)(R->world + 1) * sizeof(float));
    float *send = calloc(count * (size_t)R->world + 1, sizeof(float)), *recv = calloc(count + 1, sizeof(float));
    if (!send || !recv) FAIL(LPX_ENOMEM, "train: out of memory for the reduce-scatter buffers");
    tr_mem_add(&R->mem, TR_MEM_GRADS, sbytes);
    size_t off = 0;
    for (int p = 0; p < g->nparams; p++) {
        const tr_param *P = &g->p[p];
        if (P->group != grp) continue;
        if (!R->gacc[p]) FAIL(LPX_EINTERNAL, "train: no gradient for %s", P->name);
        const float *src = lpx_tensor_data(R->gacc[p]);
        for (int r = 0; r < R->world; r++)
            memcpy(send + (size_t)r * count + off, src + R->chunk[p] * r * P->cols,
                   sizeof(float) * (size_t)(rows_of(R, p, r) * P->cols));
        off += (size_t)(R->chunk[p] * P->cols);
        /* the full gradient is packed: drop it before the collective */
        tr_mem_add(&R->mem, TR_MEM_GRADS, -tr_tensor_bytes(R->gacc[p]));
        REL(R->gacc[p]);
    }
    TRY(lpx_comm_reduce_scatter_buf(R->comm, send, recv, count, LPX_F32, LPX_REDUCE_SUM));
    off = 0;
    for (int p = 0; p < g->nparams; p++) {
        if (g->p[p].group != grp) continue;
        memcpy(lpx_tensor_data(R->gshard[p]), recv + off, sizeof(float) * (size_t)(R->len[p] * g->p[p].cols));
        off += (size_t)(R->chunk[p] * g->p[p].cols);
    }
out:
    if (send && recv) tr_mem_add(&R->mem, TR_MEM_GRADS, -sbytes);
    free(send);
    free(recv);
    return st;
}

lpx_status tr_allreduce_adapters(tr_rank *R)
{
    lpx_status st = LPX_OK;
    size_t n = 0;
    for (int p = 0; p < R->g->nparams; p++)
        if (R->ga[p]) n += (size_t)(lpx_tensor_numel(R->ga[p]) + lpx_tensor_numel(R->gb[p]));
    float *buf = malloc(sizeof(float) * (n + 1));
    if (!buf) FAIL(LPX_ENOMEM, "train: out of memory");
    size_t off = 0;
    for (int pass = 0; pass < 2; pass++) {
        off = 0;
        for (int p = 0; p < R->g->nparams; p++) {
            lpx_tensor *ts[2] = {R->ga[p], R->gb[p]};
            for (int i = 0; i < 2; i++) {
                if (!ts[i]) continue;
                size_t k = (size_t)lpx_tensor_numel(ts[i]);
                if (pass == 0) memcpy(buf + off, lpx_tensor_data(ts[i]), k * sizeof(float));
                else memcpy(lpx_tensor_data(ts[i]), buf + off, k * sizeof(float));
                off += k;
            }
        }
        /* one all-reduce for every adapter grad of the model */
        if (pass == 0) TRY(lpx_comm_all_reduce_buf(R->comm, buf, buf, n, LPX_F32, LPX_REDUCE_SUM));
    }
out:
    free(buf);
    return st;
}

lpx_status tr_precompute_scales(tr_rank *R)
{
    lpx_status st = LPX_OK;
    int n = 0, idx[TR_MAX_PARAMS];
    float amax[TR_MAX_PARAMS];
    for (int p = 0; p < R->g->nparams; p++) {
        if (!R->fp8_wire[p]) continue;
        const float *w = lpx_tensor_data(R->master[p]);
        float m = 0;
        for (int64_t i = 0; i < lpx_tensor_numel(R->master[p]); i++) {
            float a = w[i] < 0 ? -w[i] : w[i];
            if (a > m || a != a) m = a;
        }
        idx[n] = p;
        amax[n++] = m;
    }
    if (n == 0) return LPX_OK;
    /* the one amax all-reduce of the step, for all fp8 weights at once */
    TRY(lpx_comm_all_reduce_buf(R->comm, amax, amax, (size_t)n, LPX_F32, LPX_REDUCE_MAX));
    for (int i = 0; i < n; i++) {
        double a = amax[i] > 1e-12 ? amax[i] : 1e-12;
        R->f8scale[idx[i]] = (float)(448.0 / a);
    }
out:
    return st;
}

lpx_status tr_gather_masters(tr_rank *R, float **out)
{
    lpx_status st = LPX_OK;
    float *send = NULL, *recv = NULL;
    for (int p = 0; p < R->g->nparams; p++) {
        const tr_param *P = &R->g->p[p];
        size_t cnt = (size_t)(R->chunk[p] * P->cols);
        if (!R->sharded) {
            if (R->rank == 0 && out && out[p] && R->master[p])
                memcpy(out[p], lpx_tensor_data(R->master[p]), sizeof(float) * (size_t)(P->rows * P->cols));
            continue;
        }
        send = calloc(cnt + 1, sizeof(float));
        recv = malloc(sizeof(float) * (cnt * (size_t)R->world + 1));
        if (!send || !recv) FAIL(LPX_ENOMEM, "train: out of memory");
        memcpy(send, lpx_tensor_data(R->master[p]), sizeof(float) * (size_t)(R->len[p] * P->cols));
        TRY(lpx_comm_all_gather_buf(R->comm, send, recv, cnt * sizeof(float)));
        if (R->rank == 0 && out && out[p])
            for (int r = 0; r < R->world; r++)
                memcpy(out[p] + R->chunk[p] * r * P->cols, recv + (size_t)r * cnt,
                       sizeof(float) * (size_t)(rows_of(R, p, r) * P->cols));
        free(send);
        free(recv);
        send = recv = NULL;
    }
out:
    free(send);
    free(recv);
    return st;
}
