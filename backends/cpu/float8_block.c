/* CPU kernels of the blockwise fp8 ops (ops.def, "blockwise fp8"): the
 * reference the other backends are held to (docs/NUMERICS.md,
 * "Blockwise"). Written for clarity, not speed: the scalar codec per
 * element, one pass for the block amaxes and one to encode; the GEMM
 * decodes both operands once and runs one sgemm per K block, promoting
 * each block's f32 partial sums into the f32 accumulator with the two
 * blocks' scales (DeepSeek-V3's recipe). */
#include <float.h>
#include <math.h>
#include <string.h>
#include LPX_CBLAS_HEADER
#include "../../core/dtype_internal.h"
#include "../../core/numerics/float8.h"
#include "cpu_internal.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* TransformerEngine's compute_scale_from_amax: fp8_max / amax rounded
 * once to f32; 1 for a zero amax; FLT_MAX when the quotient overflows;
 * power-of-two scales by clearing the mantissa (rounding down). */
static float block_scale(float amax, float fp8_max, bool pow2)
{
    if (amax == 0.0f) return 1.0f;
    float s = fp8_max / amax;
    if (isinf(s)) s = FLT_MAX;
    return pow2 ? float_of(bits_of(s) & 0xFF800000u) : s;
}

/* n elements to allocate (n >= 0 and already the size of a tensor that
 * exists, so no overflow); 1 for none, so that lpx_calloc succeeds */
static size_t elems(int64_t n) { return n > 0 ? (size_t)n : 1; }

static uint8_t encode(lpx_dtype fp8, float y, int sat)
{
    return fp8 == LPX_F8E4M3FN ? lpx_f32_to_f8e4m3fn(y, sat) : lpx_f32_to_f8e5m2(y, sat);
}

static lpx_status k_fp8_quantize_block(lpx_call *c)
{
    const lpx_fp8_quantize_block_args *args = lpx_op_args_of(c);
    lpx_tensor *x = args->x;
    lpx_dtype fp8 = args->fp8;
    bool pow2 = args->pow2;
    int sat = args->saturate ? 1 : 0;
    const lpx_fp8_block_geom g = args->g;
    lpx_status st;
    int64_t R = g.rows, C = g.cols, gshape[2] = {g.grid_rows, g.grid_cols}, four = 4;
    lpx_tensor *q = NULL, *ts = NULL, *tsi = NULL, *tstats = NULL;
    float *row = NULL, *amax = NULL;
    if ((st = cpu_new(c, fp8, 2, x->shape, &q)) || (st = cpu_new(c, LPX_F32, 2, gshape, &ts)) ||
        (st = cpu_new(c, LPX_F32, 2, gshape, &tsi)) ||
        (st = cpu_new(c, LPX_F32, 1, &four, &tstats)))
        goto done;
    row = lpx_calloc(elems(C), sizeof *row);
    amax = lpx_calloc(elems(g.grid_rows * g.grid_cols), sizeof *amax);
    if (!row || !amax) {
        st = lpx_error(LPX_ENOMEM, "%s: out of memory for a row of %lld values", cpu_op_name(c), (long long)C);
        goto done;
    }
    cpu_view vx;
    cpu_view_of(&vx, x);
    /* pass 1: the block amaxes; a NaN or inf fails its block */
    float total = 0.0f;
    for (int64_t r = 0; r < R; r++) {
        cpu_load_f32(&vx, r * C, C, row);
        float *am = amax + (r / g.block_rows) * g.grid_cols;
        for (int64_t k = 0; k < C; k++) {
            float a = fabsf(row[k]);
            if (!(a <= FLT_MAX)) {   /* a check that reads data: the kernel's */
                st = lpx_error(LPX_ENUMERIC, "%s: block (%lld, %lld) of %lld x %lld holds %s at [%lld, %lld]; dynamic "
                               "scaling needs finite values", cpu_op_name(c), (long long)(r / g.block_rows),
                               (long long)(k / g.block_cols), (long long)g.block_rows, (long long)g.block_cols,
                               isnan(row[k]) ? "NaN" : "+-inf", (long long)r, (long long)k);
                goto done;
            }
            if (a > am[k / g.block_cols]) am[k / g.block_cols] = a;
            if (a > total) total = a;
        }
    }
    /* pass 2: scales */
    float fp8_max = (float)lpx_dtype_get(fp8)->max;
    float *sv = lpx_tensor_data(ts), *si = lpx_tensor_data(tsi);
    for (int64_t i = 0; i < g.grid_rows * g.grid_cols; i++) {
        float s = block_scale(amax[i], fp8_max, pow2);
        amax[i] = sv[i] = s; /* amax[] now holds the scales */
        si[i] = 1.0f / s;
    }
    /* pass 3: encode, counting as fp8_quantize does */
    uint8_t *qd = lpx_tensor_data(q);
    unsigned max_code = fp8 == LPX_F8E4M3FN ? LPX_F8E4M3FN_MAX_CODE : LPX_F8E5M2_MAX_CODE;
    int64_t nonzero = 0, under = 0, saturated = 0;
    for (int64_t r = 0; r < R; r++) {
        cpu_load_f32(&vx, r * C, C, row);
        const float *sc = amax + (r / g.block_rows) * g.grid_cols;
        for (int64_t k = 0; k < C; k++) {
            float y = row[k] * sc[k / g.block_cols];
            uint8_t code = encode(fp8, y, 0);
            bool over = (code & 0x7Fu) > max_code;
            if (over) {
                saturated++;
                if (sat) code = encode(fp8, y, 1);
            }
            if (row[k] != 0.0f) {
                nonzero++;
                under += (code & 0x7Fu) == 0;
            }
            qd[r * C + k] = code;
        }
    }
    float *stv = lpx_tensor_data(tstats);
    double n = (double)(R * C);
    stv[0] = total;
    stv[1] = nonzero ? (float)((double)under / (double)nonzero) : 0.0f;
    stv[2] = n > 0 ? (float)((double)saturated / n) : 0.0f;
    stv[3] = 0.0f;
    lpx_tensor *outs[4] = {q, ts, tsi, tstats};
    for (int i = 0; i < 4; i++) cpu_ret(c, outs[i]);
    q = ts = tsi = tstats = NULL;
done:
    lpx_free(row);
    lpx_free(amax);
    lpx_tensor_release(q);
    lpx_tensor_release(ts);
    lpx_tensor_release(tsi);
    lpx_tensor_release(tstats);
    return st;
}

static lpx_status k_fp8_dequantize_block(lpx_call *c)
{
    const lpx_fp8_dequantize_block_args *a = lpx_op_args_of(c);
    lpx_tensor *q = a->q, *si = a->scale_inv;
    lpx_dtype dt = a->dtype;
    const lpx_fp8_block_geom g = a->g;
    lpx_status st;
    lpx_tensor *y = NULL, *sif = NULL;
    float *row = NULL;
    if ((st = cpu_new(c, dt, 2, q->shape, &y)) || (st = cpu_contiguous_f32(si, &sif))) goto done;
    row = lpx_calloc(elems(g.cols), sizeof *row);
    if (!row) {
        st = lpx_error(LPX_ENOMEM, "%s: out of memory for a row of %lld values", cpu_op_name(c), (long long)g.cols);
        goto done;
    }
    cpu_view vq, vy;
    cpu_view_of(&vq, q);
    cpu_view_of(&vy, y);
    const float *s = lpx_tensor_data(sif);
    float omax = cpu_f8_out_max(dt);
    for (int64_t r = 0; r < g.rows; r++) {
        cpu_load_f32(&vq, r * g.cols, g.cols, row);
        const float *sr = s + (r / g.block_rows) * g.grid_cols;
        for (int64_t k = 0; k < g.cols; k++) {
            float sk = sr[k / g.block_cols];
            row[k] = lpx_f8_dequant_sat(row[k], sk, row[k] * sk, omax);   /* finite code: finite value */
        }
        cpu_store_f32(&vy, r * g.cols, g.cols, row, 0);
    }
    cpu_ret(c, y);
    y = NULL;
done:
    lpx_free(row);
    lpx_tensor_release(y);
    lpx_tensor_release(sif);
    return st;
}

/* Decodes fp8 t [R, C] (any strides) into a row-major f32 buffer. */
static float *decode_all(const lpx_tensor *t)
{
    int64_t R = t->shape[0], C = t->shape[1];
    float *d = lpx_calloc(elems(R * C), sizeof *d);
    if (!d) return NULL;
    cpu_view v;
    cpu_view_of(&v, t);
    for (int64_t p = 0; p < R * C; p += CPU_CHUNK) {
        int64_t n = R * C - p < CPU_CHUNK ? R * C - p : CPU_CHUNK;
        cpu_load_f32(&v, p, n, d + p);
    }
    return d;
}

static lpx_status k_fp8_mm_block(lpx_call *c)
{
    const lpx_fp8_mm_block_args *args = lpx_op_args_of(c);
    lpx_tensor *a = args->a, *asi = args->a_scale_inv, *b = args->b, *bsi = args->b_scale_inv, *bias = args->bias;
    lpx_dtype odt = args->out_dtype;
    const lpx_fp8_block_mm_geom g = args->g;
    lpx_status st;
    int64_t M = g.M, N = g.N, K = g.K, kb = g.a.block_cols, oshape[2] = {M, N};
    lpx_tensor *y = NULL, *sa = NULL, *sb = NULL, *bf = NULL;
    float *A = NULL, *B = NULL, *acc = NULL, *part = NULL;
    if ((st = cpu_new(c, odt, 2, oshape, &y)) || (st = cpu_contiguous_f32(asi, &sa)) ||
        (st = cpu_contiguous_f32(bsi, &sb)) || (bias && (st = cpu_contiguous_f32(bias, &bf))))
        goto done;
    A = decode_all(a);
    B = decode_all(b);
    acc = lpx_calloc(elems(M * N), sizeof *acc);
    part = lpx_calloc(elems(M * N), sizeof *part);
    if (!A || !B || !acc || !part) {
        st = lpx_error(LPX_ENOMEM, "%s: out of memory for [%lld, %lld] @ [%lld, %lld] in f32", cpu_op_name(c),
                       (long long)M, (long long)K, (long long)K, (long long)N);
        goto done;
    }
    const float *fa = lpx_tensor_data(sa), *fb = lpx_tensor_data(sb);
    for (int64_t k0 = 0, j = 0; k0 < K; k0 += kb, j++) {
        int64_t kn = K - k0 < kb ? K - k0 : kb;
        if (M && N)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)kn, 1.0f, A + k0, (int)K,
                        B + k0 * N, (int)N, 0.0f, part, (int)N);
        /* promotion: this K block's partial sums, scaled by both blocks'
         * scale_inv (their product rounded once to f32), into acc */
        for (int64_t m = 0; m < M; m++) {
            float s_a = fa[(m / g.a.block_rows) * g.a.grid_cols + j];
            const float *s_b = fb + j * g.b.grid_cols;
            for (int64_t n = 0; n < N; n++) acc[m * N + n] += part[m * N + n] * (s_a * s_b[n / g.b.block_cols]);
        }
    }
    if (bf) {
        const float *bv = lpx_tensor_data(bf);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) acc[m * N + n] += bv[n];
    }
    cpu_view vy;
    cpu_view_of(&vy, y);
    cpu_store_f32(&vy, 0, M * N, acc, 0);
    cpu_ret(c, y);
    y = NULL;
done:
    lpx_free(A);
    lpx_free(B);
    lpx_free(acc);
    lpx_free(part);
    lpx_tensor_release(y);
    lpx_tensor_release(sa);
    lpx_tensor_release(sb);
    lpx_tensor_release(bf);
    return st;
}

lpx_status lpx_cpu_register_float8_block(void)
{
    lpx_status st;
    if ((st = cpu_reg(LPX_OP_fp8_quantize_block, k_fp8_quantize_block)) ||
        (st = cpu_reg(LPX_OP_fp8_dequantize_block, k_fp8_dequantize_block)))
        return st;
    return cpu_reg(LPX_OP_fp8_mm_block, k_fp8_mm_block);
}
