/* A framework author's view of plugins: load the MX formats plugin by path,
 * keep a linear layer's weight as mxfp4 (4.25 bits per weight), and run
 * the layer through the ordinary lpx_linear. Nothing here knows MX: the
 * kind is found by name and the dispatcher routes linear to the plugin's
 * kernel.
 *
 * Build: cc mxfp4_weights.c $(pkg-config --cflags --libs lpx) -lm
 * Run:   ./a.out /usr/lib/lpx/lpx-mx.so   (or LPX_PLUGIN_PATH=/usr/lib/lpx ./a.out) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "lpx/lpx.h"

static int fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, lpx_last_error());
    return 1;
}

/* roughly N(0, 1): a sum of 4 uniforms from a small LCG, reproducible */
static float noise(void)
{
    static uint32_t s = 12345;
    float acc = 0;
    for (int k = 0; k < 4; k++) {
        s = s * 1664525u + 1013904223u;
        acc += (float)(s >> 8) / 16777216.0f - 0.5f;
    }
    return acc * 1.7320508f;
}

int main(int argc, char **argv)
{
    /* 1. the plugin: by path, or already there through LPX_PLUGIN_PATH */
    const lpx_kind *mxfp4 = NULL;
    if (argc > 1 && lpx_plugin_load(argv[1], NULL) != LPX_OK) return fail("loading the MX plugin");
    if (lpx_kind_find("mxfp4", &mxfp4) != LPX_OK) return fail("finding kind mxfp4");

    /* 2. the framework's own weight buffer [out=256, in=512], wrapped without a copy */
    enum { OUT = 256, IN = 512, BATCH = 8 };
    float *w = malloc(sizeof(float) * OUT * IN), *x = malloc(sizeof(float) * BATCH * IN);
    if (!w || !x) return 1;
    for (int i = 0; i < OUT * IN; i++) w[i] = 0.05f * noise();
    for (int i = 0; i < BATCH * IN; i++) x[i] = noise();
    int64_t ws[2] = {OUT, IN}, xs[2] = {BATCH, IN};
    lpx_tensor *tw = NULL, *tx = NULL, *w4 = NULL, *y = NULL, *yref = NULL;
    if (lpx_tensor_from_blob(w, LPX_F32, 2, ws, NULL, lpx_cpu(), NULL, NULL, &tw) ||
        lpx_tensor_from_blob(x, LPX_F32, 2, xs, NULL, lpx_cpu(), NULL, NULL, &tx))
        return fail("wrapping buffers");

    /* 3. quantize once; the f32 weight could be dropped now */
    if (lpx_kind_from_dense(mxfp4, tw, &w4)) return fail("quantizing to mxfp4");
    char desc[256];
    lpx_kind_vtable(mxfp4)->describe(w4, desc, sizeof desc);
    printf("weight: %s\n", desc);

    /* 4. use it like any weight: y = x @ W^T */
    if (lpx_linear(tx, w4, NULL, &y)) return fail("linear with the mxfp4 weight");
    if (lpx_linear(tx, tw, NULL, &yref)) return fail("linear with the f32 weight");
    const float *a = lpx_tensor_data(y), *b = lpx_tensor_data(yref);
    double num = 0, den = 0;
    for (int i = 0; i < BATCH * OUT; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    double sqnr = 10 * log10(den / num);
    printf("linear [%d, %d] x mxfp4 [%d, %d]^T: SQNR vs f32 weights %.1f dB\n", BATCH, IN, OUT, IN, sqnr);

    /* errors stay values that name the kind and the argument */
    lpx_tensor *bad = NULL;
    if (lpx_narrow(w4, 1, 0, 16, &bad) != LPX_OK) printf("expected error: %s\n", lpx_last_error());

    lpx_tensor_release(yref);
    lpx_tensor_release(y);
    lpx_tensor_release(w4);
    lpx_tensor_release(tx);
    lpx_tensor_release(tw);
    free(w);
    free(x);
    return sqnr > 12 ? 0 : 1;
}
