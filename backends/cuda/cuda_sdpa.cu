/* cuDNN's fused scaled-dot-product attention (flash attention: the T x S
 * score matrix is never stored) for lpx-cuda's attention and
 * attention_backward, through the cuDNN frontend's graph API
 * (third_party/cudnn_frontend, header-only). libcudnn is opened at run time
 * (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): lpx-cuda loads and runs its
 * reference kernels on a machine without cuDNN.
 *
 * Used when the call fits what cuDNN's fused kernels take (cu_sdpa_fits):
 * bf16 or f16 q, k, v (and grad, out) of one dtype, contiguous [B, T, H, D]
 * (the view of a linear's output, so no transpose is made: the graph reads
 * it through strides as cuDNN's (b, h, s, d)), head dim a multiple of 8 up
 * to 128, T == S when causal (top-left and bottom-right alignment agree),
 * H a multiple of KH (grouped-query attention is cuDNN's own), sm_80 or
 * newer. Everything else runs the reference kernels in cuda_attention.cu.
 * LPX_CUDA_ATTENTION=reference forces those (comparisons, debugging).
 *
 * lse: cuDNN's softmax statistics are the natural-log log-sum-exp of each
 * row's scaled scores, f32 (b, h, t, 1): lpx's lse [B, H, T] in the same
 * units, so a forward of either path feeds a backward of either.
 *
 * One graph per (device, dtype, shape, causal, scale, direction), built on
 * first use (cuDNN's heuristics mode A) and kept for the life of the
 * process; one cuDNN handle per device, bound to lpx-cuda's stream before
 * each execution and used under a lock (a handle is not thread-safe). The
 * workspace comes from lpx-cuda's stream-ordered allocator.
 *
 * Finding libcudnn.so.9: cuda_cudnn_find.h (the loader's search, then
 * LPX_CUDNN_PATH, then the nvidia/cudnn/lib folder of the Python
 * site-packages that a loaded library lives under). When none loads, the
 * first bf16/f16 call that cuDNN would have taken says so on stderr, once,
 * with every place looked at, and `lpx info` says it too: the fallback to
 * the reference kernels is never silent.
 *
 * The environment: this file writes none of it after init. The frontend
 * reads CUDNN_FRONTEND_CUDART_LIB_NAME (getenv, no API) to choose the CUDA
 * runtime it opens; cu_sdpa_init_env sets it from lpx_plugin_init, before
 * any host thread can run an lpx op (setenv is not safe beside a concurrent
 * getenv in glibc). */
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <link.h>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include "cuda_cudnn_find.h"
#include "cuda_sdpa.h"

namespace fe = cudnn_frontend;

/* the frontend's handle on libcudnn (it declares it; the program defines it) */
void *cudnn_frontend::cudnn_dlhandle = nullptr;

namespace {

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

using sdpa_key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, bool, uint32_t, bool>;

struct sdpa_state {
    std::mutex mu;
    bool tried = false;
    bool ok = false;
    bool forced = false;   /* LPX_CUDA_ATTENTION=reference: a choice, not a failure */
    bool warned = false;   /* the missing-cuDNN line went to stderr */
    char why[2048] = "";
    char lib[CU_CUDNN_PATH_MAX] = "";   /* the file loaded */
    char loaded[64][CU_CUDNN_PATH_MAX] = {};   /* site-packages folders of loaded libraries */
    long version = 0;
    uint64_t runs = 0;   /* calls that ran on cuDNN */
    cudnnHandle_t handle[CU_SDPA_MAX_DEVICES] = {};
    std::map<sdpa_key, std::shared_ptr<fe::graph::Graph>> graphs;
};

sdpa_state &state()
{
    static sdpa_state s;
    return s;
}

void set_why(char *why, size_t n, const char *fmt, const char *a)
{
    if (why && n) snprintf(why, n, fmt, a);
}

/* opens libcudnn once (under s.mu) */
bool load(sdpa_state &s)
{
    if (s.tried) return s.ok;
    s.tried = true;
    const char *force = getenv("LPX_CUDA_ATTENTION");
    if (force && !strcmp(force, "reference")) {
        snprintf(s.why, sizeof s.why, "LPX_CUDA_ATTENTION=reference");
        s.forced = true;
        return false;
    }
    size_t nl = cu_loaded_objects(s.loaded, sizeof s.loaded / sizeof *s.loaded);
    const char *paths[sizeof s.loaded / sizeof *s.loaded];
    for (size_t i = 0; i < nl; i++) paths[i] = s.loaded[i];
    char chosen[CU_CUDNN_PATH_MAX], looked[sizeof s.why - 64];
    cudnn_frontend::cudnn_dlhandle = cu_cudnn_open(dlopen, dlerror, RTLD_NOW | RTLD_LOCAL, getenv("LPX_CUDNN_PATH"),
                                                   paths, nl, chosen, sizeof chosen, looked, sizeof looked);
    if (!cudnn_frontend::cudnn_dlhandle) {
        snprintf(s.why, sizeof s.why, "libcudnn.so.9 not found (looked: %s)", looked);
        return false;
    }
    /* the file the loader chose (the name alone says nothing) */
    struct link_map *lm = nullptr;
    if (dlinfo(cudnn_frontend::cudnn_dlhandle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(s.lib, sizeof s.lib, "%s", lm->l_name);
    else
        snprintf(s.lib, sizeof s.lib, "%s", chosen);
    try {
        s.version = (long)fe::detail::get_backend_version();
    } catch (const std::exception &e) {
        snprintf(s.why, sizeof s.why, "cuDNN (%s): %s", s.lib, e.what());
        return false;
    }
    if (s.version < 90000) {
        snprintf(s.why, sizeof s.why, "cuDNN %ld (%s) is older than 9.0", s.version, s.lib);
        return false;
    }
    s.ok = true;
    return true;
}

std::vector<int64_t> bshd_stride(int64_t T, int64_t H, int64_t D) { return {T * H * D, D, H * D, 1}; }

std::shared_ptr<fe::graph::Graph> build(sdpa_state &s, const cu_sdpa_shape &x, bool bwd, char *why, size_t wn)
{
    int dev = x.device;
    if (!s.handle[dev]) {
        if (cudaSetDevice(dev) != cudaSuccess || fe::detail::create_handle(&s.handle[dev]) != CUDNN_STATUS_SUCCESS) {
            s.handle[dev] = nullptr;
            set_why(why, wn, "%s", "cudnnCreate failed");
            return nullptr;
        }
    }
    auto io = x.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
        fe::DataType_t::FLOAT);
    auto tensor = [&](const char *name, int uid, int64_t heads, int64_t len) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({x.B, heads, len, x.D})
                             .set_stride(bshd_stride(len, heads, x.D)));
    };
    auto Q = tensor("Q", UID_Q, x.H, x.T), K = tensor("K", UID_K, x.KH, x.S), V = tensor("V", UID_V, x.KH, x.S);
    if (!bwd) {
        auto o = fe::graph::SDPA_attributes().set_name("lpx_attention").set_generate_stats(true).set_attn_scale(
            x.scale);
        if (x.causal) o.set_causal_mask(true);
        auto [O, Stats] = g->sdpa(Q, K, V, o);
        O->set_output(true).set_uid(UID_O).set_dim({x.B, x.H, x.T, x.D}).set_stride(bshd_stride(x.T, x.H, x.D));
        Stats->set_output(true)
            .set_uid(UID_STATS)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({x.B, x.H, x.T, 1})
            .set_stride({x.H * x.T, x.T, 1, 1});
    } else {
        auto O = tensor("O", UID_O, x.H, x.T), dO = tensor("dO", UID_DO, x.H, x.T);
        auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_uid(UID_STATS)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_dim({x.B, x.H, x.T, 1})
                                   .set_stride({x.H * x.T, x.T, 1, 1}));
        auto o = fe::graph::SDPA_backward_attributes().set_name("lpx_attention_backward").set_attn_scale(x.scale);
        if (x.causal) o.set_causal_mask(true);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, o);
        dQ->set_output(true).set_uid(UID_DQ).set_dim({x.B, x.H, x.T, x.D}).set_stride(bshd_stride(x.T, x.H, x.D));
        dK->set_output(true).set_uid(UID_DK).set_dim({x.B, x.KH, x.S, x.D}).set_stride(bshd_stride(x.S, x.KH, x.D));
        dV->set_output(true).set_uid(UID_DV).set_dim({x.B, x.KH, x.S, x.D}).set_stride(bshd_stride(x.S, x.KH, x.D));
    }
    auto st = g->build(s.handle[dev], {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (st.is_bad()) {
        set_why(why, wn, "cuDNN cannot run this attention: %s", st.get_message().c_str());
        return nullptr;
    }
    return g;
}

sdpa_key key_of(const cu_sdpa_shape &x, bool bwd)
{
    uint32_t sb;
    memcpy(&sb, &x.scale, sizeof sb);
    return sdpa_key(x.device, x.bf16, x.B, x.T, x.S, x.H * 1000 + x.KH, x.D, x.causal, sb, bwd);
}

/* the cached (or new) graph of x, its workspace bytes; nullptr with why */
std::shared_ptr<fe::graph::Graph> graph_of(const cu_sdpa_shape &x, bool bwd, int64_t *ws, char *why, size_t wn)
{
    sdpa_state &s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!load(s)) {
        set_why(why, wn, "%s", s.why);
        return nullptr;
    }
    if (x.device < 0 || x.device >= CU_SDPA_MAX_DEVICES) {
        set_why(why, wn, "%s", "device index beyond the cuDNN path's table");
        return nullptr;
    }
    auto k = key_of(x, bwd);
    auto it = s.graphs.find(k);
    std::shared_ptr<fe::graph::Graph> g;
    if (it != s.graphs.end()) {
        g = it->second;
    } else {
        try {
            g = build(s, x, bwd, why, wn);
        } catch (const std::exception &e) {
            set_why(why, wn, "cuDNN frontend: %s", e.what());
            g = nullptr;
        }
        s.graphs[k] = g; /* a shape cuDNN refused is not tried again */
    }
    if (!g) {
        if (why && !why[0]) set_why(why, wn, "%s", "cuDNN refused this shape earlier");
        return nullptr;
    }
    int64_t n = 0;
    if (g->get_workspace_size(n).is_bad()) {
        set_why(why, wn, "%s", "cuDNN workspace size unknown");
        return nullptr;
    }
    *ws = n;
    return g;
}

int run(const cu_sdpa_shape &x, bool bwd, std::unordered_map<int64_t, void *> &pack, void *ws, cudaStream_t stream,
        char *why, size_t wn)
{
    sdpa_state &s = state();
    int64_t need = 0;
    auto g = graph_of(x, bwd, &need, why, wn);
    if (!g) return -1;
    std::lock_guard<std::mutex> lock(s.mu);
    try {
        if (fe::detail::set_stream(s.handle[x.device], stream) != CUDNN_STATUS_SUCCESS) {
            set_why(why, wn, "%s", "cudnnSetStream failed");
            return -1;
        }
        auto st = g->execute(s.handle[x.device], pack, ws);
        if (st.is_bad()) {
            set_why(why, wn, "cuDNN execute: %s", st.get_message().c_str());
            return -1;
        }
        s.runs++;
    } catch (const std::exception &e) {
        set_why(why, wn, "cuDNN frontend: %s", e.what());
        return -1;
    }
    return 0;
}

} // namespace

extern "C" {

int cu_sdpa_fits(const cu_sdpa_shape *x, int sm_major, char *why, size_t wn)
{
    if (sm_major < 8) return set_why(why, wn, "%s", "needs sm_80 or newer"), 0;
    if (x->D % 8 || x->D > 128) return set_why(why, wn, "%s", "head dim not a multiple of 8 up to 128"), 0;
    if (x->causal && x->T != x->S) return set_why(why, wn, "%s", "causal with q_len != kv_len"), 0;
    if (x->KH <= 0 || x->H % x->KH) return set_why(why, wn, "%s", "heads not a multiple of kv heads"), 0;
    if (x->B * x->H * x->T * x->S == 0) return set_why(why, wn, "%s", "empty"), 0;
    sdpa_state &s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!load(s)) {
        if (!s.forced && !s.warned) {
            /* a call cuDNN would take runs the slow kernel: say so, once */
            s.warned = true;
            fprintf(stderr, "lpx-cuda: attention: cuDNN's fused SDPA unavailable, running the reference kernel "
                            "(slow): %s\n", s.why);
        }
        return set_why(why, wn, "%s", s.why), 0;
    }
    return 1;
}

void cu_sdpa_init_env(void)
{
    /* the frontend opens libcudart itself and prefers .so.12 when both are
     * on the path: name the runtime this plugin was built with (only when
     * the user did not). Called from lpx_plugin_init, before any lpx op
     * can run on another thread; no other environment write in lpx-cuda. */
    char cudart[32];
    snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart, 0);
}

int64_t cu_sdpa_workspace(const cu_sdpa_shape *x, int backward, char *why, size_t wn)
{
    int64_t n = 0;
    return graph_of(*x, backward != 0, &n, why, wn) ? n : -1;
}

int cu_sdpa_forward(const cu_sdpa_shape *x, const void *q, const void *k, const void *v, void *o, float *lse, void *ws,
                    cudaStream_t stream, char *why, size_t wn)
{
    std::unordered_map<int64_t, void *> pack = {{UID_Q, const_cast<void *>(q)}, {UID_K, const_cast<void *>(k)},
                                                {UID_V, const_cast<void *>(v)}, {UID_O, o},
                                                {UID_STATS, lse}};
    return run(*x, false, pack, ws, stream, why, wn);
}

int cu_sdpa_backward(const cu_sdpa_shape *x, const void *grad, const void *q, const void *k, const void *v,
                     const void *o, const float *lse, void *dq, void *dk, void *dv, void *ws, cudaStream_t stream,
                     char *why, size_t wn)
{
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, const_cast<void *>(q)},  {UID_K, const_cast<void *>(k)},        {UID_V, const_cast<void *>(v)},
        {UID_O, const_cast<void *>(o)},  {UID_DO, const_cast<void *>(grad)},    {UID_STATS, const_cast<float *>(lse)},
        {UID_DQ, dq},                    {UID_DK, dk},                          {UID_DV, dv}};
    return run(*x, true, pack, ws, stream, why, wn);
}

int cu_sdpa_describe(char *buf, size_t n)
{
    sdpa_state &s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (load(s)) {
        snprintf(buf, n, "cuDNN %ld.%ld.%ld fused SDPA (%s; flash; bf16/f16, head dim <= 128; %llu calls so far), "
                 "else the reference kernel", s.version / 10000, s.version / 100 % 100, s.version % 100, s.lib,
                 (unsigned long long)s.runs);
        return s.runs ? (s.runs > 1000000 ? 1000000 : (int)s.runs) : 0;
    }
    snprintf(buf, n, "reference kernel (warp per query row; cuDNN fused SDPA not used: %s)", s.why);
    return 0;
}

} /* extern "C" */
