// ATen reference for `lpx bench dispatch`: ns per call of at::add_out on
// 16-element float tensors, the C++ analog of lpx_add_out (dispatched op
// writing into a preallocated output). Timing method matches lpx's
// lpx_bench_measure: calibrate a batch to ~batch_ms, warm up, then take the
// median over `reps` timed batches.
//
// Output, one line per case (read by tools/lpx/bench_dispatch.c):
//   <case> <median_ns> <min_ns>
// Usage: torch_add_out [--reps N] [--batch-ms MS]
#include <ATen/ATen.h>
#include <ATen/CPUFunctions.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double now_ns()
{
    return std::chrono::duration<double, std::nano>(clock_type::now().time_since_epoch()).count();
}

struct Stats {
    double median_ns;
    double min_ns;
};

// batch(n) runs the op n times.
Stats measure(const std::function<void(int64_t)> &batch, int reps, double batch_ms)
{
    int64_t n = 1;
    double t = 0;
    for (;;) {
        double t0 = now_ns();
        batch(n);
        t = now_ns() - t0;
        if (t >= batch_ms * 1e5 || n >= (int64_t(1) << 40)) break;
        n *= 2;
    }
    double per = t / double(n);
    int64_t size = std::max<int64_t>(1, int64_t(batch_ms * 1e6 / (per > 0 ? per : 1)));
    double warm_end = now_ns() + 50e6;
    do batch(size);
    while (now_ns() < warm_end);
    std::vector<double> v(size_t(reps > 0 ? reps : 1));
    for (double &x : v) {
        double t0 = now_ns();
        batch(size);
        x = (now_ns() - t0) / double(size);
    }
    std::sort(v.begin(), v.end());
    size_t k = v.size();
    double med = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
    return {med, v.front()};
}

} // namespace

int main(int argc, char **argv)
{
    int reps = 101;
    double batch_ms = 2;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--batch-ms") && i + 1 < argc) batch_ms = std::atof(argv[++i]);
        else {
            std::fprintf(stderr, "usage: %s [--reps N] [--batch-ms MS]\n", argv[0]);
            return 2;
        }
    }
    // one thread: a 16-element add never parallelizes, and lpx runs it
    // on the calling thread too
    at::set_num_threads(1);
    at::Tensor a = at::rand({16}, at::kFloat), b = at::rand({16}, at::kFloat);
    at::Tensor c = at::empty({16}, at::kFloat);

    // What a C++ framework pays per op: dispatcher, autograd key included
    // (the tensors do not require grad, but the key is in their key set).
    Stats s = measure([&](int64_t n) { for (int64_t i = 0; i < n; i++) at::add_out(c, a, b); }, reps, batch_ms);
    std::printf("aten_add_out %.3f %.3f\n", s.median_ns, s.min_ns);

    // Inference mode skips the autograd and ADInplaceOrView keys: the
    // cheapest dispatched path ATen offers.
    {
        c10::InferenceMode guard;
        at::Tensor ai = at::rand({16}, at::kFloat), bi = at::rand({16}, at::kFloat);
        at::Tensor ci = at::empty({16}, at::kFloat);
        s = measure([&](int64_t n) { for (int64_t i = 0; i < n; i++) at::add_out(ci, ai, bi); }, reps, batch_ms);
        std::printf("aten_add_out_inference %.3f %.3f\n", s.median_ns, s.min_ns);
    }

    // The CPU kernel without the dispatcher: at::cpu::add_out calls the
    // structured kernel directly (our "direct kernel call" analog).
    s = measure([&](int64_t n) { for (int64_t i = 0; i < n; i++) at::cpu::add_out(c, a, b); }, reps, batch_ms);
    std::printf("aten_cpu_add_out %.3f %.3f\n", s.median_ns, s.min_ns);
    std::fflush(stdout);
    return 0;
}
