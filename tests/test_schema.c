/* Schema strings: what parses, what is refused and with which message. */
#include "check.h"

static void test_good_schemas(void)
{
    const char *good[] = {
        "a(Tensor x) -> Tensor",
        "b(Tensor x, Tensor? y, Tensor[] zs, int i, int? j, int[] s, int[]? t, float f, float? g, bool b, dtype d, dtype? e, str s2, str? s3, ptr p, device dev) -> (Tensor, Tensor)",
        "  c ( Tensor   x ,int n )->( Tensor , Tensor , Tensor )  ",
        "d(Tensor x) -> ()",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        lpx_op op;
        CHECKF(lpx_op_register(good[i], &op) == LPX_OK, "%s: %s", good[i], lpx_last_error());
    }
    lpx_op op;
    CHECK_OK(lpx_op_find("b", &op));
    CHECK(lpx_op_nargs(op) == 16 && lpx_op_nrets(op) == 2);
    CHECK_OK(lpx_op_find("c", &op));
    CHECK(lpx_op_nargs(op) == 2 && lpx_op_nrets(op) == 3);
    CHECK_OK(lpx_op_find("d", &op));
    CHECK(lpx_op_nrets(op) == 0);
}

static void test_bad_schemas(void)
{
    const char *bad[] = {
        "", "noparen", "x(Tensor a)", "x(Tensor a) ->", "x(Tensor a) -> int", "x(Tensr a) -> Tensor",
        "x(Tensor) -> Tensor", "x(Tensor a,) -> Tensor", "x(Tensor a) -> Tensor junk",
        "1x(Tensor a) -> Tensor", "x(Tensor a -> Tensor", "x(Tensor a) -> (Tensor",
        ("x(Tensor a, Tensor b, Tensor c, Tensor d, Tensor e, Tensor f, Tensor g, Tensor h, Tensor i, Tensor j, "
         "Tensor k, Tensor l, Tensor m, Tensor n, Tensor o, Tensor p, Tensor q) -> Tensor"),
        "x(Tensor a) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        "a_name_that_is_much_longer_than_forty_seven_characters_in_total(Tensor a) -> Tensor",
        "x(Tensor?? a) -> Tensor", "x(int[][] a) -> Tensor",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lpx_op op;
        lpx_clear_error();
        lpx_status st = lpx_op_register(bad[i], &op);
        CHECKF(st == LPX_EINVAL, "'%s' gave %s", bad[i], lpx_status_string(st));
        CHECKF(strstr(lpx_last_error(), "schema") != NULL, "'%s': message '%s'", bad[i], lpx_last_error());
    }
    CHECK_ERR(lpx_op_register(NULL, NULL), LPX_EINVAL);
    /* nothing half-registered */
    lpx_op op;
    CHECK_ERR(lpx_op_find("x", &op), LPX_ENOTFOUND);
}

static void test_builtin_schemas(void)
{
    /* every built-in op parsed and sits at its enum id */
    for (int op = 0; op < LPX_OP_BUILTIN_COUNT; op++) {
        CHECK(lpx_op_name(op) != NULL);
        CHECK(lpx_op_schema(op) != NULL);
        lpx_op found;
        CHECK_OK(lpx_op_find(lpx_op_name(op), &found));
        CHECK(found == op);
    }
    CHECK(strcmp(lpx_op_name(LPX_OP_matmul), "matmul") == 0);
    CHECK(lpx_op_nrets(LPX_OP_rmsnorm) == 2);
}

/* Op ids are ABI: plugins compile LPX_OP_* in. Every id of this list is
 * pinned; new ops are appended after the last one (ops.def's rule), so an
 * insertion or a reordering fails here, naming the first moved op. */
static void test_op_ids_pinned(void)
{
    static const char *const pinned[] = {
    "empty", "zeros", "full", "arange", "randn", "rand", "view", "reshape", "transpose", "t", "permute", "slice",
    "narrow", "expand", "contiguous", "cat", "clone", "detach", "add", "sub", "mul", "div", "add_scalar",
    "mul_scalar", "neg", "abs", "sqrt", "exp", "relu", "silu", "gelu", "relu_backward", "silu_backward",
    "gelu_backward", "cast", "copy_", "fill_", "sum", "mean", "max", "amax", "norm", "matmul", "linear", "addmm",
    "rmsnorm", "rmsnorm_backward", "softmax", "softmax_backward", "cross_entropy", "cross_entropy_backward",
    "mse_loss", "mse_loss_backward", "embedding", "embedding_backward", "fp8_quantize", "fp8_quantize_t",
    "fp8_dequantize", "fp8_scaled_mm", "fp8_scale_from_amax", "nf4_quantize", "nf4_dequantize", "nf4_mm",
    "qlora_dropout", "adamw_", "rope", "rope_backward", "attention", "attention_backward", "fp8_quantize_block",
    "fp8_dequantize_block", "fp8_mm_block", "swiglu", "swiglu_backward", "adamw_state_",
    };
    int n = (int)(sizeof pinned / sizeof *pinned);
    CHECK_OK(lpx_init());
    CHECKF(LPX_OP_BUILTIN_COUNT >= n, "%d built-in ops, %d pinned: an op was removed", (int)LPX_OP_BUILTIN_COUNT, n);
    for (int i = 0; i < n && i < LPX_OP_BUILTIN_COUNT; i++)
        if (!lpx_op_name((lpx_op)i) || strcmp(lpx_op_name((lpx_op)i), pinned[i])) {
            CHECKF(0, "op id %d is '%s', pinned as '%s': ops were inserted or reordered (append new ops at the end "
                   "of ops.def)", i, lpx_op_name((lpx_op)i) ? lpx_op_name((lpx_op)i) : "(none)", pinned[i]);
            break;
        }
    CHECK(LPX_OP_rope == 65 && LPX_OP_attention_backward == 68);
    CHECK(LPX_OP_fp8_mm_block == 71 && LPX_OP_swiglu == 72 && LPX_OP_swiglu_backward == 73);
    CHECK(LPX_OP_adamw_state_ == 74);
}

int main(void)
{
    RUN(test_op_ids_pinned);
    RUN(test_good_schemas);
    RUN(test_bad_schemas);
    RUN(test_builtin_schemas);
    return CHECK_DONE();
}
