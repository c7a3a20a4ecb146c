// The public headers compile as C++ (extern "C", no C-only constructs
// outside guards) and link against liblpx.
#include "lpx/lpx.h"
#include <cstdio>

int main()
{
    lpx_tensor *t = nullptr;
    int64_t shape[2] = {2, 2};
    if (lpx_tensor_new(LPX_F32, 2, shape, lpx_cpu(), &t) != LPX_OK) {
        std::printf("FAIL: %s\n", lpx_last_error());
        return 1;
    }
    lpx_value v = lpx_v_tensor(t);
    bool ok = v.tag == LPX_TAG_TENSOR && sizeof(lpx_value) == 16;
    lpx_tensor_release(t);
    std::printf("%s headers compile as C++\n", ok ? "ok  " : "FAIL");
    return ok ? 0 : 1;
}
