/* Embedding lpx: wrap your own buffers, call ops, read the result.
 * Build: cc embed.c $(pkg-config --cflags --libs lpx) */
#include <stdio.h>
#include "lpx/lpx.h"

int main(void)
{
    /* Your framework's memory: lpx wraps it without copying. */
    float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    float w[3 * 2] = {1, 0, 0, 1, 1, 1};
    int64_t xs[2] = {2, 3}, ws[2] = {3, 2};
    lpx_tensor *tx = NULL, *tw = NULL, *y = NULL, *z = NULL, *bad = NULL;

    if (lpx_tensor_from_blob(x, LPX_F32, 2, xs, NULL, lpx_cpu(), NULL, NULL, &tx) ||
        lpx_tensor_from_blob(w, LPX_F32, 2, ws, NULL, lpx_cpu(), NULL, NULL, &tw) ||
        lpx_matmul(tx, tw, &y) ||      /* y = x @ w, through BLAS */
        lpx_relu(y, &z)) {             /* every op goes through the dispatcher */
        fprintf(stderr, "lpx: %s\n", lpx_last_error());
        return 1;
    }
    const float *out = lpx_tensor_data(z);   /* z is dense f32 [2, 2] */
    printf("[[%g, %g], [%g, %g]]\n", out[0], out[1], out[2], out[3]);

    /* Errors are values, with a message naming op and argument. */
    if (lpx_matmul(tx, tx, &bad) != LPX_OK)   /* [2,3] @ [2,3] */
        printf("error: %s\n", lpx_last_error());

    lpx_tensor_release(z);
    lpx_tensor_release(y);
    lpx_tensor_release(tw);
    lpx_tensor_release(tx);
    return 0;
}
