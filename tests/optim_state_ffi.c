/* A tiny shared library over core/numerics/optim_state.h for
 * tests/python/optim_vs_torchao.py (ctypes): the code maps, the blockwise
 * quantizers and whole AdamW runs of each state kind, so the Python test
 * compares them with torchao's AdamW8bit / AdamW4bit / AdamWFp8. Test
 * code only; not installed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/numerics/optim_state.h"
#include "lpx/lpx.h"

#if defined(__GNUC__)
#  define FFI __attribute__((visibility("default")))
#else
#  define FFI
#endif

FFI int lpx_osffi_map(int map, float *out);
FFI int lpx_osffi_quant_map(int map, const float *x, int64_t n, int block, uint8_t *codes, float *scales);
FFI int lpx_osffi_quant_e4m3(const float *x, int64_t n, int block, uint8_t *codes, float *scales);
FFI int lpx_osffi_run_op(int kind, int64_t block, int64_t n, int steps, const float *grads, float *p, double lr,
                         double beta1, double beta2, double eps, double weight_decay, uint8_t *m_codes,
                         float *m_scales, void *v_codes, float *v_scales);
FFI int lpx_osffi_run(int kind, int64_t n, int steps, const float *grads, float *p, double lr, double beta1,
                      double beta2, double eps, double weight_decay, uint8_t *m_codes, float *m_scales,
                      void *v_codes, float *v_scales);

/** The 2^bits values of map `map` (LPX_OS_MAP*); returns their count. */
int lpx_osffi_map(int map, float *out)
{
    if (map < 0 || map > 3) return -1;
    lpx_os_map_fill(map, out);
    return 1 << lpx_os_map_bits(map);
}

/** Blocks of `block` over x[0..n): one code per element (4-bit codes
 *  unpacked from the packed bytes), one scale per block. */
int lpx_osffi_quant_map(int map, const float *x, int64_t n, int block, uint8_t *codes, float *scales)
{
    if (map < 0 || map > 3 || block < 2 || block > LPX_OS_BLOCK_MAX) return -1;
    float q[256];
    lpx_os_map_fill(map, q);
    for (int64_t b = 0; b * block < n; b++) {
        int len = n - b * block < block ? (int)(n - b * block) : block;
        const float *xb = x + b * block;
        uint8_t *cb = codes + b * block;
        if (lpx_os_map_bits(map) == 8) {
            scales[b] = lpx_os_quant8(q, xb, len, cb);
        } else {
            uint8_t packed[LPX_OS_BLOCK_MAX / 2];
            scales[b] = lpx_os_quant4(q, xb, len, packed);
            for (int i = 0; i < len; i++) cb[i] = (uint8_t)(i & 1 ? packed[i / 2] & 15u : packed[i / 2] >> 4);
        }
    }
    return 0;
}

int lpx_osffi_quant_e4m3(const float *x, int64_t n, int block, uint8_t *codes, float *scales)
{
    if (block < 1 || block > LPX_OS_BLOCK_MAX) return -1;
    for (int64_t b = 0; b * block < n; b++) {
        int len = n - b * block < block ? (int)(n - b * block) : block;
        scales[b] = lpx_os_quant_e4m3(x + b * block, len, codes + b * block);
    }
    return 0;
}

/** `steps` AdamW steps (t = 1..steps) of state kind `kind`
 *  (LPX_OS_STATE_*) over the f32 parameter p[0..n), grads[t - 1] the
 *  n-element grad of step t, starting from torchao's zero state (codes 0,
 *  scales 0). Writes the final states: m codes (packed for 4-bit),
 *  v codes (u8, packed u8 or u16 for the fp8 kind's f16 v) and scales. */
int lpx_osffi_run(int kind, int64_t n, int steps, const float *grads, float *p, double lr, double beta1,
                  double beta2, double eps, double weight_decay, uint8_t *m_codes, float *m_scales,
                  void *v_codes, float *v_scales)
{
    if (kind < 0 || kind > 3 || n < 1) return -1;
    int64_t block = lpx_os_state_block(kind), nb = (n + block - 1) / block;
    int64_t cb = kind == LPX_OS_STATE_4BIT ? block / 2 : block; /* code bytes per block */
    float qm[256], qv[256];
    lpx_os_map_fill(kind == LPX_OS_STATE_4BIT ? LPX_OS_MAP4_SIGNED : LPX_OS_MAP8_SIGNED, qm);
    lpx_os_map_fill(kind == LPX_OS_STATE_4BIT ? LPX_OS_MAP4_UNSIGNED : LPX_OS_MAP8_UNSIGNED, qv);
    memset(m_codes, 0, (size_t)(nb * cb));
    memset(v_codes, 0, (size_t)(nb * cb) * (kind == LPX_OS_STATE_FP8 ? 2 : 1));
    memset(m_scales, 0, (size_t)nb * sizeof(float));
    memset(v_scales, 0, (size_t)nb * sizeof(float));
    for (int t = 1; t <= steps; t++) {
        lpx_os_adamw k = lpx_os_adamw_consts(lr, beta1, beta2, eps, weight_decay, t);
        const float *g = grads + (int64_t)(t - 1) * n;
        for (int64_t b = 0; b < nb; b++) {
            int len = n - b * block < block ? (int)(n - b * block) : (int)block;
            float *pb = p + b * block;
            const float *gb = g + b * block;
            uint8_t *mc = m_codes + b * cb;
            switch (kind) {
            case LPX_OS_STATE_8BIT:
                lpx_os_adamw8_block(&k, qm, qv, len, pb, gb, mc, &m_scales[b], (uint8_t *)v_codes + b * cb,
                                    &v_scales[b]);
                break;
            case LPX_OS_STATE_4BIT:
                lpx_os_adamw4_block(&k, qm, qv, len, pb, gb, mc, &m_scales[b], (uint8_t *)v_codes + b * cb,
                                    &v_scales[b]);
                break;
            case LPX_OS_STATE_FP8:
                lpx_os_adamwfp8_block(&k, len, pb, gb, mc, &m_scales[b], (uint16_t *)v_codes + b * cb, &v_scales[b]);
                break;
            default:
                lpx_os_adamwfp8_e4m3v_block(&k, len, pb, gb, mc, &m_scales[b], (uint8_t *)v_codes + b * cb,
                                            &v_scales[b]);
            }
        }
    }
    return 0;
}

/** The same run through liblpx: state tensors of kind os_8bit / os_4bit /
 *  os_fp8 (kind 0..2) in blocks of `block`, `steps` calls of the dispatched
 *  adamw_ (the kinds' handler, the op adamw_state_, the CPU kernel); the
 *  final codes and scales copied out of the state tensors' inner tensors
 *  (laid out as lpx_osffi_run's). Returns 0, or the failing lpx_status
 *  (its message on stderr). */
int lpx_osffi_run_op(int kind, int64_t block, int64_t n, int steps, const float *grads, float *p, double lr,
                     double beta1, double beta2, double eps, double weight_decay, uint8_t *m_codes, float *m_scales,
                     void *v_codes, float *v_scales)
{
    if (kind < 0 || kind > 2 || n < 1) return -1;
    lpx_status st = lpx_init();
    lpx_tensor *pt = NULL, *gt = NULL, *m = NULL, *v = NULL;
    if (!st) st = lpx_tensor_new(LPX_F32, 1, &n, lpx_cpu(), &pt);
    if (!st) st = lpx_tensor_new(LPX_F32, 1, &n, lpx_cpu(), &gt);
    if (!st) st = lpx_optim_state_new((lpx_optim_state_format)kind, LPX_OPTIM_STATE_M, 1, &n, block, lpx_cpu(), &m);
    if (!st) st = lpx_optim_state_new((lpx_optim_state_format)kind, LPX_OPTIM_STATE_V, 1, &n, block, lpx_cpu(), &v);
    if (!st) memcpy(lpx_tensor_data(pt), p, (size_t)n * sizeof(float));
    for (int t = 1; t <= steps && !st; t++) {
        memcpy(lpx_tensor_data(gt), grads + (int64_t)(t - 1) * n, (size_t)n * sizeof(float));
        st = lpx_adamw_(&pt, &gt, &m, &v, 1, lr, beta1, beta2, eps, weight_decay, t);
    }
    if (!st) {
        memcpy(p, lpx_tensor_data(pt), (size_t)n * sizeof(float));
        lpx_tensor *in[4] = {lpx_tensor_inner(m, 0), lpx_tensor_inner(m, 1), lpx_tensor_inner(v, 0),
                             lpx_tensor_inner(v, 1)};
        void *out[4] = {m_codes, m_scales, v_codes, v_scales};
        for (int i = 0; i < 4; i++)
            memcpy(out[i], lpx_tensor_data(in[i]),
                   (size_t)lpx_dtype_nbytes(lpx_tensor_dtype(in[i]), lpx_tensor_numel(in[i])));
    } else {
        fprintf(stderr, "lpx_osffi_run_op: %s\n", lpx_last_error());
    }
    lpx_tensor_release(pt);
    lpx_tensor_release(gt);
    lpx_tensor_release(m);
    lpx_tensor_release(v);
    return (int)st;
}
