/* Where a rank computes: the CPU, or its GPU (--device cuda), or the
 * simulated device that stands for a GPU in CI (--device sim,
 * lpx-simdev.so: the same device paths, the CPU's arithmetic).
 *
 * The model code never asks: it calls lpx ops on tensors, and the ops run
 * where their inputs live. What the trainer makes itself goes through
 * here: the token ids and rope frequencies (uploaded once per forward /
 * per run), the rows of logits that sampling reads back, and the small
 * host-side collectives of the trainer (losses, NaN counts, gathered
 * masters), which an NCCL comm refuses in host memory and which are
 * therefore staged through device buffers. On the CPU every function here
 * is the plain host operation, so the CPU suite runs the same calls.
 *
 * --device cuda hands the engine its params on the GPU, so its shards,
 * grad shards and AdamW state live there (the device-resident engine,
 * docs/SHARDING.md); with --offload they are handed in on the host and
 * stay there (the engine's CPU offload). Either way every unsharded
 * weight, activation, GEMM and collective is on the GPU (shard.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/cuda.h"
#include "lpx/plugin.h"
#include "rank.h"
#include "../lpx/commands.h"

/* lpx-nccl.so's export (backends/nccl/lpx_nccl.h, which a tool does not
 * include: plugins are reached through their exported symbols) */
typedef int (*nccl_comm_device_fn)(const lpx_comm *comm);
#define NCCL_SYM_COMM_DEVICE "lpx_nccl_comm_device"

bool tr_on_gpu(const tr_rank *R) { return R->dev.type != LPX_DEVICE_CPU; }

lpx_status tr_device_setup(tr_rank *R)
{
    R->dev = lpx_cpu();
    if (!strcmp(R->o->device, "sim")) {
        /* the simulated device stands for a GPU (lpx-simdev.so): comm
         * "sim" puts rank r on sim:r, as NCCL puts it on cuda:r */
        R->dev.type = LPX_DEVICE_SIM;
        R->dev.index = R->rank;
        return LPX_OK;
    }
    if (strcmp(R->o->device, "cuda")) return LPX_OK;
    /* the comm's GPU: device r for rank r of a one-process world, the
     * local rank under mpirun (lpx-nccl decides; this only asks) */
    nccl_comm_device_fn dev_of = NULL;
    void *sym = lpx_tool_plugin_fn("nccl", NCCL_SYM_COMM_DEVICE);
    memcpy(&dev_of, &sym, sizeof sym);
    int d = dev_of ? dev_of(R->comm) : -1;
    if (d < 0)
        return lpx_error(LPX_EDEVICE, "train: --device cuda: rank %d's comm is not an NCCL comm on a GPU (--comm %s)",
                         R->rank, R->o->comm);
    R->dev.type = LPX_DEVICE_CUDA;
    R->dev.index = d;
    return LPX_OK;
}

lpx_status tr_host_tensor(tr_rank *R, lpx_dtype dtype, int ndim, const int64_t *shape, const void *v, lpx_tensor **out)
{
    lpx_tensor *h = NULL;
    lpx_status st = lpx_empty(ndim, shape, dtype, lpx_cpu(), &h);
    if (st == LPX_OK) {
        memcpy(lpx_tensor_data(h), v, lpx_dtype_nbytes(dtype, lpx_tensor_numel(h)));
        st = lpx_tensor_to(h, R->dev, out);
    }
    lpx_tensor_release(h);
    return st;
}

lpx_status tr_row_to_host(lpx_tensor *x, int64_t row, float *out)
{
    lpx_tensor *r = NULL, *c = NULL, *h = NULL;
    lpx_status st = lpx_narrow(x, 0, row, 1, &r);
    if (st == LPX_OK) st = lpx_cast(r, LPX_F32, false, &c);
    if (st == LPX_OK) st = lpx_tensor_to(c, lpx_cpu(), &h);
    if (st == LPX_OK && !lpx_tensor_is_contiguous(h)) st = lpx_error(LPX_EINTERNAL, "train: a row copy is strided");
    if (st == LPX_OK) memcpy(out, lpx_tensor_data(h), lpx_dtype_nbytes(LPX_F32, lpx_tensor_numel(h)));
    lpx_tensor_release(r);
    lpx_tensor_release(c);
    lpx_tensor_release(h);
    return st;
}

lpx_status tr_poison2(lpx_tensor *x)
{
    /* elements 0 and 1 of the flat tensor: NaN and inf, through views,
     * so the write happens where x lives */
    lpx_tensor *flat = NULL, *e = NULL;
    int64_t n = lpx_tensor_numel(x);
    lpx_status st = lpx_view(x, 1, &n, &flat);
    if (st == LPX_OK) st = lpx_narrow(flat, 0, 0, 1, &e);
    if (st == LPX_OK) st = lpx_fill_(e, NAN);
    lpx_tensor_release(e);
    e = NULL;
    if (st == LPX_OK) st = lpx_narrow(flat, 0, 1, 1, &e);
    if (st == LPX_OK) st = lpx_fill_(e, INFINITY);
    lpx_tensor_release(e);
    lpx_tensor_release(flat);
    return st;
}

lpx_status tr_all_gather_host(tr_rank *R, const void *send, void *recv, size_t nbytes)
{
    if (!tr_on_gpu(R)) return lpx_comm_all_gather_buf(R->comm, send, recv, nbytes);
    /* NCCL reads and writes device memory only: the receive buffer goes up
     * with this rank's block already in its slot (one upload, no cross-
     * device copy op), is gathered in place and read back whole */
    lpx_tensor *h = NULL, *d = NULL, *back = NULL;
    int64_t all = (int64_t)nbytes * R->world;
    lpx_status st = lpx_zeros(1, &all, LPX_U8, lpx_cpu(), &h);
    if (st == LPX_OK) {
        if (nbytes) memcpy((unsigned char *)lpx_tensor_data(h) + nbytes * (size_t)R->rank, send, nbytes);
        st = lpx_tensor_to(h, R->dev, &d);
    }
    if (st == LPX_OK)
        st = lpx_comm_all_gather_buf(R->comm, (unsigned char *)lpx_tensor_data(d) + nbytes * (size_t)R->rank,
                                     lpx_tensor_data(d), nbytes);
    if (st == LPX_OK) st = lpx_tensor_to(d, lpx_cpu(), &back);
    if (st == LPX_OK && all) memcpy(recv, lpx_tensor_data(back), (size_t)all);
    lpx_tensor_release(h);
    lpx_tensor_release(d);
    lpx_tensor_release(back);
    return st;
}

lpx_status tr_device_sync(tr_rank *R)
{
    if (!tr_on_gpu(R)) return LPX_OK;
    if (R->dev.type != LPX_DEVICE_CUDA) {
        const lpx_backend_i *be = lpx_backend_for(R->dev.type);
        return be && be->sync ? be->sync(be->self, R->dev) : LPX_OK;
    }
    lpx_cuda_sync_fn sync = NULL;
    void *sym = lpx_tool_plugin_fn("cuda", LPX_CUDA_SYM_SYNC);
    memcpy(&sync, &sym, sizeof sym);
    return sync ? sync(R->dev.index) : LPX_OK;
}

int64_t tr_device_peak(tr_rank *R, bool reset)
{
    if (R->dev.type != LPX_DEVICE_CUDA) return -1;
    lpx_cuda_mem_stats_fn stats = NULL;
    lpx_cuda_mem_reset_peak_fn rst = NULL;
    void *s1 = lpx_tool_plugin_fn("cuda", LPX_CUDA_SYM_MEM_STATS);
    void *s2 = lpx_tool_plugin_fn("cuda", LPX_CUDA_SYM_MEM_RESET_PEAK);
    memcpy(&stats, &s1, sizeof s1);
    memcpy(&rst, &s2, sizeof s2);
    lpx_cuda_mem_stats ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = sizeof ms;
    int64_t peak = stats && stats(R->dev.index, &ms) == LPX_OK ? (int64_t)ms.peak_bytes_in_use : -1;
    if (reset && rst) (void)rst(R->dev.index);
    lpx_clear_error();
    return peak;
}
