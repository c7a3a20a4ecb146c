/*
 * SPDX-FileCopyrightText: Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 * SPDX-License-Identifier: Apache-2.0
 */

#pragma once

#include <cuda.h>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#ifdef _WIN32
#include <cuda_runtime_api.h>
#if CUDART_VERSION < 13000 || CUDART_VERSION >= 14000
#error "cuDNN Frontend dynamic loading on Windows requires CUDA 13 headers and a CUDA 13 runtime"
#endif
#define NOMINMAX
#include <windows.h>
#include <memory>
#include <string>

namespace cudnn_frontend::detail {
inline const char *
windows_dlerror() {
    const auto code = GetLastError();
    SetLastError(ERROR_SUCCESS);
    if (code == ERROR_SUCCESS) {
        return nullptr;
    }
    static thread_local std::string message;
    message = "Windows error " + std::to_string(code);
    return message.c_str();
}

inline HMODULE
windows_dlopen(const char *name) {
    // DEFAULT_DIRS includes directories registered by Python's
    // os.add_dll_directory(). The legacy search is retained as a fallback for
    // callers that supply their CUDA installation through PATH.
    DWORD flags = LOAD_LIBRARY_SEARCH_DEFAULT_DIRS;
    std::string full_path;
    const char *library = name;
    if (std::string(name).find_first_of("\\/:") != std::string::npos) {
        const DWORD size = GetFullPathNameA(name, 0, nullptr, nullptr);
        if (size) {
            full_path.resize(size);
            const DWORD written = GetFullPathNameA(name, size, full_path.data(), nullptr);
            if (written && written < size) {
                full_path.resize(written);
                library = full_path.c_str();
                flags |= LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR;
            }
        }
    }
    auto handle = LoadLibraryExA(library, nullptr, flags);
    if (!handle) {
        const auto error = GetLastError();
        handle           = LoadLibraryA(name);
        if (!handle) {
            SetLastError(error);
        }
    }
    if (handle) {
        SetLastError(ERROR_SUCCESS);
    }
    return handle;
}

inline FARPROC
windows_dlsym(HMODULE handle, const char *name) {
    auto symbol = GetProcAddress(handle, name);
    if (symbol) {
        SetLastError(ERROR_SUCCESS);
    }
    return symbol;
}
}  // namespace cudnn_frontend::detail

#define dlerror() cudnn_frontend::detail::windows_dlerror()
#define dlopen(x, y) cudnn_frontend::detail::windows_dlopen(x)
#define dlsym(x, y) cudnn_frontend::detail::windows_dlsym(x, y)
#define dlclose(x) FreeLibrary(x)
#else
#include <dlfcn.h>
#define HMODULE void *
#endif
#include <mutex>
#include <stdexcept>
#include <string>
#include <cstdio>
#endif

namespace cudnn_frontend {

// Portable environment-variable accessor. Wraps std::getenv and locally silences MSVC's C4996
// ("getenv is unsafe") warning, which is treated as an error under /WX. Safe here because the
// returned value is only read. Defined in this low-level header so every layer (including
// Logging) can share a single definition without inverting include dependencies.
inline const char *
get_environment(const char *name) {
#ifdef _WIN32
#pragma warning(push)
#pragma warning(disable : 4996)
#endif
    return std::getenv(name);
#ifdef _WIN32
#pragma warning(pop)
#endif
}

// cudnn package initialization set this global handle
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#ifdef _WIN32
extern HMODULE cudnn_dlhandle;
#else
extern void *cudnn_dlhandle;
#endif
#endif

namespace detail {

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING

inline auto
get_symbol(const char *function_name) {
    auto ret = dlsym(cudnn_dlhandle, function_name);
    return ret;
}

enum class CudaLibrary { CUDART, CUDA };

// On Windows dlerror() is GetLastError(), an error code that successful calls do not reset (#809),
// so success is judged by the returned handle or symbol alone and the code is only reported.
inline std::string
last_dl_error() {
#ifdef _WIN32
    return "Windows error " + std::to_string(GetLastError());
#else
    const char *error = dlerror();
    return error ? error : "Unknown error";
#endif
}

inline HMODULE
load_cuda_so() {
    // Clear any existing error
    dlerror();

#ifdef _WIN32
    constexpr const char *lib = "nvcuda.dll";
#else
    constexpr const char *lib = "libcuda.so.1";
#endif

    // Attempt to open the cuda library
    HMODULE handle = dlopen(lib, RTLD_NOW);
    if (!handle) {
        // If opening the library fails, throw an exception with the error message
        throw std::runtime_error("Unable to dlopen " + std::string(lib) + " : " + last_dl_error());
    }

    return handle;
}

#ifdef _WIN32
inline HMODULE
validate_cuda13_runtime(HMODULE handle, const char *library) {
    // Own the reference before diagnostics can allocate or throw.
    std::unique_ptr<std::remove_pointer_t<HMODULE>, decltype(&FreeLibrary)> owner(handle, &FreeLibrary);
    // CUDA 13 graph wrappers use CUDA 13 signatures. Symbol names alone do not
    // distinguish those signatures from the incompatible CUDA 12 entry points.
    dlerror();
    auto symbol       = dlsym(handle, "cudaRuntimeGetVersion");
    const char *error = reinterpret_cast<const char *>(dlerror());
    if (!symbol || error) {
        const std::string message = "Cannot validate CUDA 13 runtime " + std::string(library) + ": " +
                                    std::string(error ? error : "cudaRuntimeGetVersion unavailable");
        throw std::runtime_error(message);
    }
    int version = 0;
    auto status = reinterpret_cast<decltype(&cudaRuntimeGetVersion)>(symbol)(&version);
    if (status != cudaSuccess || version / 1000 != 13) {
        throw std::runtime_error("CUDA 13 runtime required; " + std::string(library) + " reported version " +
                                 std::to_string(version) + " (cudaRuntimeGetVersion status " +
                                 std::to_string(static_cast<int>(status)) + ")");
    }
    return owner.release();
}
#endif

inline HMODULE
load_cudart_so() {
    // Clear any existing error
    dlerror();

    // Allow the user to override the libcudart selection via an environment variable.
    // This is useful in environments (e.g. containers such as GKE with the TCPXO NCCL
    // plugin) where multiple major versions of libcudart are present in the library
    // search path. In such cases the automatic detection below warns about the ambiguity
    // (see below) and falls back to the first match. Setting CUDNN_FRONTEND_CUDART_LIB_NAME
    // to the desired library name (or path), e.g. "libcudart.so.13", bypasses the detection
    // and loads exactly that library. On Windows, overrides must also report CUDA 13.
    const char *user_lib = get_environment("CUDNN_FRONTEND_CUDART_LIB_NAME");
    if (user_lib) {
        if (user_lib[0] != '\0') {
            HMODULE handle = dlopen(user_lib, RTLD_NOW);
            if (!handle) {
                throw std::runtime_error(
                    "Unable to load libcudart library specified by CUDNN_FRONTEND_CUDART_LIB_NAME (" +
                    std::string(user_lib) + "): " + last_dl_error());
            }
#ifdef _WIN32
            return validate_cuda13_runtime(handle, user_lib);
#else
            return handle;
#endif
        }
    }

#ifdef _WIN32
    // Windows dynamic loading currently supports CUDA 13 only.
    constexpr const char *library = "cudart64_13.dll";
    HMODULE handle                = dlopen(library, RTLD_NOW);
    const char *error             = reinterpret_cast<const char *>(dlerror());
    if (!handle || error) {
        throw std::runtime_error("CUDA 13 runtime unavailable: unable to load " + std::string(library) + ": " +
                                 std::string(error ? error : "Unknown error"));
    }
    return validate_cuda13_runtime(handle, library);
#else
    // List of potential libcudart libraries (Adding major version to support python package)
    constexpr const char *libs[] = {"libcudart.so.12", "libcudart.so.13"};
    constexpr size_t num_libs    = sizeof(libs) / sizeof(libs[0]);

    HMODULE lib_handle = nullptr;
    int loaded_index   = -1;

    for (size_t i = 0; i < num_libs; ++i) {
        dlerror();
        HMODULE handle = dlopen(libs[i], RTLD_NOW);

        if (handle) {
            if (lib_handle) {
                // Already loaded one -> multiple found. This is not fatal: warn on stderr and keep
                // the first one found. Set CUDNN_FRONTEND_CUDART_LIB_NAME to select one explicitly.
                dlclose(handle);
                std::fprintf(stderr,
                             "cuDNN Frontend warning: Multiple libcudart libraries found: %s and %s. "
                             "Using %s. Set CUDNN_FRONTEND_CUDART_LIB_NAME to select one explicitly.\n",
                             libs[loaded_index],
                             libs[i],
                             libs[loaded_index]);
            } else {
                lib_handle   = handle;
                loaded_index = static_cast<int>(i);
            }
        }
    }

    // If opening the library fails, throw an exception with the error message
    if (!lib_handle) {
        std::string tried;
        for (size_t i = 0; i < num_libs; ++i) {
            tried += (i ? ", " : "") + std::string(libs[i]);
        }
        throw std::runtime_error("Unable to load any libcudart library (tried " + tried + ").");
    }

    return lib_handle;
#endif
}

inline void *
get_cuda_symbol(CudaLibrary library, const char *function_name) {
    // Static mutex to ensure thread-safety
    (void)function_name;
    // Intentionally leaked: destructors of other statics (e.g. a cached execution plan releasing
    // its CUDA graph user object) call back in here during process teardown (#1486).
    static std::mutex &cuda_lib_mutex = *new std::mutex;
    // Static map to store handles for different libraries
    static std::unordered_map<CudaLibrary, HMODULE> &dl_handles = *new std::unordered_map<CudaLibrary, HMODULE>;

    // Lock the mutex to ensure thread-safe access
    std::lock_guard<std::mutex> lock(cuda_lib_mutex);

    // If the library hasn't been opened yet, open it and store the handle to future use
    if (dl_handles.find(library) == dl_handles.end()) {
        dl_handles[library] = (library == CudaLibrary::CUDART) ? load_cudart_so() : load_cuda_so();
    }

    // Clear any existing error before calling dlsym
    dlerror();

    // Try to find the symbol (function) in the library
    void *symbol = reinterpret_cast<void *>(dlsym(dl_handles[library], function_name));
    if (!symbol) {
        // If the symbol is not found, throw an exception with details
        throw std::runtime_error("Unable to find symbol " + std::string(function_name) + ": " + last_dl_error());
    }

    // Return the pointer to the function
    return symbol;
}

#endif

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define NV_CUDNN_FE_DYNAMIC_CHECK_BACKEND_DESCRIPTOR(MINIMUM_VERSION, DESCRIPTOR, MESSAGE) \
    if (MINIMUM_VERSION > detail::get_backend_version()) {                                 \
        set_error_and_throw_exception(&DESCRIPTOR, CUDNN_STATUS_INVALID_VALUE, MESSAGE);   \
        return std::move(DESCRIPTOR);                                                      \
    }
#else
#define NV_CUDNN_FE_DYNAMIC_CHECK_BACKEND_DESCRIPTOR(MINIMUM_VERSION, DESCRIPTOR, MESSAGE)
#endif

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define NV_CUDNN_FE_DYNAMIC_CHECK_CUDNN_BACKEND_VERSION(MINIMUM_VERSION, STATUS) \
    if (MINIMUM_VERSION > detail::get_backend_version()) {                       \
        return STATUS;                                                           \
    }
#else
#define NV_CUDNN_FE_DYNAMIC_CHECK_CUDNN_BACKEND_VERSION(MINIMUM_VERSION, STATUS)
#endif

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define NV_FE_CALL_TO_BACKEND(function_name, backend_symbol, ...)           \
    static void *fptr = get_symbol(#backend_symbol);                        \
    if (fptr == nullptr) {                                                  \
        throw std::runtime_error("Unable to find symbol " #backend_symbol); \
    }                                                                       \
    return reinterpret_cast<decltype(function_name) *>(fptr)(__VA_ARGS__);
#else
#define NV_FE_CALL_TO_BACKEND(function_name, backend_symbol, ...) return backend_symbol(__VA_ARGS__);
#endif

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING

#define NV_FE_CALL_TO_CUDA(function_name, cuda_symbol, ...) \
    return reinterpret_cast<decltype(function_name) *>(get_cuda_symbol(CudaLibrary::CUDART, #cuda_symbol))(__VA_ARGS__);
#define NV_FE_CALL_TO_CU(function_name, cuda_symbol, ...) \
    return reinterpret_cast<decltype(function_name) *>(get_cuda_symbol(CudaLibrary::CUDA, #cuda_symbol))(__VA_ARGS__);

#else

#define NV_FE_CALL_TO_CUDA(function_name, cuda_symbol, ...) return cuda_symbol(__VA_ARGS__);
#define NV_FE_CALL_TO_CU(function_name, cuda_symbol, ...) return cuda_symbol(__VA_ARGS__);

#endif

#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
// Version of the libcudart that was loaded, which can be a different major than CUDART_VERSION
// (e.g. a CUDA 13 wheel next to a CUDA 12 torch). Entry points whose ABI changed between majors
// dispatch on it (#1563).
inline int
loaded_cudart_version() {
    static int const version = [] {
        using Fn  = cudaError_t (*)(int *);
        int value = 0;
        if (reinterpret_cast<Fn>(get_cuda_symbol(CudaLibrary::CUDART, "cudaRuntimeGetVersion"))(&value) !=
            cudaSuccess) {
            value = 0;
        }
        return value;
    }();
    return version;
}
#endif

inline cudaError_t
cuda_runtime_get_version(int *version) {
    NV_FE_CALL_TO_CUDA(cuda_runtime_get_version, cudaRuntimeGetVersion, version);
}

// Version of the CUDA runtime this process actually loaded, as major * 1000 +
// minor * 10 (12.8 -> 12080, 13.2 -> 13020).  cudaRuntimeGetVersion has one ABI
// on every CUDA 12 and 13 runtime, so it can be resolved before the version is
// known, and the answer cannot change within a process.
inline int
get_cuda_runtime_version() {
    static int const version = []() {
        int value = 0;
        if (cuda_runtime_get_version(&value) != cudaSuccess) {
            return 0;
        }
        return value;
    }();
    return version;
}

inline cudaError_t
cuda_graph_create(cudaGraph_t *pGraph, unsigned int flags) {
    NV_FE_CALL_TO_CUDA(cuda_graph_create, cudaGraphCreate, pGraph, flags);
}

inline cudaError_t
cuda_graph_get_nodes(cudaGraph_t hGraph, cudaGraphNode_t *nodes, size_t *numNodes) {
    NV_FE_CALL_TO_CUDA(cuda_graph_get_nodes, cudaGraphGetNodes, hGraph, nodes, numNodes);
}

inline cudaError_t
cuda_graph_add_child_graph_node(cudaGraphNode_t *pGraphNode,
                                cudaGraph_t graph,
                                const cudaGraphNode_t *pDependencies,
                                size_t numDependencies,
                                cudaGraph_t childGraph) {
    NV_FE_CALL_TO_CUDA(cuda_graph_add_child_graph_node,
                       cudaGraphAddChildGraphNode,
                       pGraphNode,
                       graph,
                       pDependencies,
                       numDependencies,
                       childGraph);
}

inline cudaError_t
cuda_graph_add_memcpy_node_1D(cudaGraphNode_t *pGraphNode,
                              cudaGraph_t graph,
                              const cudaGraphNode_t *pDependencies,
                              size_t numDependencies,
                              void *dst,
                              const void *src,
                              size_t count,
                              cudaMemcpyKind kind) {
    NV_FE_CALL_TO_CUDA(cuda_graph_add_memcpy_node_1D,
                       cudaGraphAddMemcpyNode1D,
                       pGraphNode,
                       graph,
                       pDependencies,
                       numDependencies,
                       dst,
                       src,
                       count,
                       kind);
}

inline cudaError_t
cuda_graph_add_memset_node(cudaGraphNode_t *pGraphNode,
                           cudaGraph_t graph,
                           const cudaGraphNode_t *pDependencies,
                           size_t numDependencies,
                           const cudaMemsetParams *pMemsetParams) {
    NV_FE_CALL_TO_CUDA(cuda_graph_add_memset_node,
                       cudaGraphAddMemsetNode,
                       pGraphNode,
                       graph,
                       pDependencies,
                       numDependencies,
                       pMemsetParams);
}

inline cudaError_t
cuda_graph_get_root_nodes(cudaGraph_t hGraph, cudaGraphNode_t *phNodes, size_t *pNumNodes) {
    NV_FE_CALL_TO_CUDA(cuda_graph_get_root_nodes, cudaGraphGetRootNodes, hGraph, phNodes, pNumNodes);
}

inline cudaError_t
cuda_graph_child_graph_node_get_graph(cudaGraphNode_t hNode, cudaGraph_t *phGraph) {
    NV_FE_CALL_TO_CUDA(cuda_graph_child_graph_node_get_graph, cudaGraphChildGraphNodeGetGraph, hNode, phGraph);
}

// 4-parameter shim for cudaGraphNodeGetDependentNodes.
// The underlying CUDA feature was introduced in CUDA 12.3, but
// for simplicity we support this in 13.0+ only.
#if (CUDART_VERSION >= 13000)
inline cudaError_t
cuda_graph_node_get_dependent_nodes_v2(cudaGraphNode_t node,
                                       cudaGraphNode_t *pDependentNodes,
                                       cudaGraphEdgeData *edgeData,
                                       size_t *pNumDependentNodes) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    // A build against the CUDA 13 headers can be running on a CUDA 12 runtime,
    // which the loader prefers when both are present.  The edge-data form is the
    // BASE symbol only from CUDA 13 on: on CUDA 12 the base symbol still takes
    // three parameters and the edge-data form is the _v2 one, so resolving by
    // name alone would pass edgeData where the count is expected.
    if (get_cuda_runtime_version() >= 13000) {
        NV_FE_CALL_TO_CUDA(cuda_graph_node_get_dependent_nodes_v2,
                           cudaGraphNodeGetDependentNodes,
                           node,
                           pDependentNodes,
                           edgeData,
                           pNumDependentNodes);
    }
    NV_FE_CALL_TO_CUDA(cuda_graph_node_get_dependent_nodes_v2,
                       cudaGraphNodeGetDependentNodes_v2,
                       node,
                       pDependentNodes,
                       edgeData,
                       pNumDependentNodes);
#else
    NV_FE_CALL_TO_CUDA(cuda_graph_node_get_dependent_nodes_v2,
                       cudaGraphNodeGetDependentNodes,
                       node,
                       pDependentNodes,
                       edgeData,
                       pNumDependentNodes);
#endif
}
#endif

// 3-parameter shim for cudaGraphNodeGetDependentNodes.
inline cudaError_t
cuda_graph_node_get_dependent_nodes(cudaGraphNode_t node,
                                    cudaGraphNode_t *pDependentNodes,
                                    size_t *pNumDependentNodes) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    // CUDA 13 added an edge-data parameter to the unversioned symbol.
    void *fptr = get_cuda_symbol(CudaLibrary::CUDART, "cudaGraphNodeGetDependentNodes");
    if (loaded_cudart_version() >= 13000) {
        using Fn = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t *, void *, size_t *);
        return reinterpret_cast<Fn>(fptr)(node, pDependentNodes, /*edgeData=*/nullptr, pNumDependentNodes);
    }
    using Fn = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t *, size_t *);
    return reinterpret_cast<Fn>(fptr)(node, pDependentNodes, pNumDependentNodes);
#elif (CUDART_VERSION >= 13000)
    // The 3-parameter version of cudaGraphNodeGetDependentNodes was removed in CUDA 13.0,
    // so call the other shim.
    return cuda_graph_node_get_dependent_nodes_v2(node, pDependentNodes, /*edgeData=*/nullptr, pNumDependentNodes);
#else
    NV_FE_CALL_TO_CUDA(
        cuda_graph_node_get_dependent_nodes, cudaGraphNodeGetDependentNodes, node, pDependentNodes, pNumDependentNodes);
#endif
}

// 4-parameter shim for cudaGraphNodeGetDependencies.
// Same story as the DependentNodes shim above: the edge-data form exists from
// CUDA 12.3, and the 3-parameter form is gone in CUDA 13.0.
#if (CUDART_VERSION >= 13000)
inline cudaError_t
cuda_graph_node_get_dependencies_v2(cudaGraphNode_t node,
                                    cudaGraphNode_t *pDependencies,
                                    cudaGraphEdgeData *edgeData,
                                    size_t *pNumDependencies) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    // Same dispatch as the DependentNodes shim above: the base symbol carries the
    // edge-data form only from CUDA 13 on, the _v2 symbol carries it on CUDA 12.
    if (get_cuda_runtime_version() >= 13000) {
        NV_FE_CALL_TO_CUDA(cuda_graph_node_get_dependencies_v2,
                           cudaGraphNodeGetDependencies,
                           node,
                           pDependencies,
                           edgeData,
                           pNumDependencies);
    }
    NV_FE_CALL_TO_CUDA(cuda_graph_node_get_dependencies_v2,
                       cudaGraphNodeGetDependencies_v2,
                       node,
                       pDependencies,
                       edgeData,
                       pNumDependencies);
#else
    NV_FE_CALL_TO_CUDA(cuda_graph_node_get_dependencies_v2,
                       cudaGraphNodeGetDependencies,
                       node,
                       pDependencies,
                       edgeData,
                       pNumDependencies);
#endif
}
#endif

// 3-parameter shim for cudaGraphNodeGetDependencies.
inline cudaError_t
cuda_graph_node_get_dependencies(cudaGraphNode_t node, cudaGraphNode_t *pDependencies, size_t *pNumDependencies) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    // CUDA 13 added an edge-data parameter to the unversioned symbol. Dispatch on the loaded runtime, not on
    // CUDART_VERSION of the headers this file was compiled with.
    void *fptr = get_cuda_symbol(CudaLibrary::CUDART, "cudaGraphNodeGetDependencies");
    if (loaded_cudart_version() >= 13000) {
        using Fn = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t *, void *, size_t *);
        return reinterpret_cast<Fn>(fptr)(node, pDependencies, /*edgeData=*/nullptr, pNumDependencies);
    }
    using Fn = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t *, size_t *);
    return reinterpret_cast<Fn>(fptr)(node, pDependencies, pNumDependencies);
#elif (CUDART_VERSION >= 13000)
    // The 3-parameter version of cudaGraphNodeGetDependencies was removed in CUDA 13.0,
    // so call the other shim.
    return cuda_graph_node_get_dependencies_v2(node, pDependencies, /*edgeData=*/nullptr, pNumDependencies);
#else
    NV_FE_CALL_TO_CUDA(
        cuda_graph_node_get_dependencies, cudaGraphNodeGetDependencies, node, pDependencies, pNumDependencies);
#endif
}

inline cudaError_t
cuda_graph_add_memcpy_node_set_params_1D(cudaGraphNode_t node,
                                         void *dst,
                                         const void *src,
                                         size_t count,
                                         cudaMemcpyKind kind) {
    NV_FE_CALL_TO_CUDA(
        cuda_graph_add_memcpy_node_set_params_1D, cudaGraphMemcpyNodeSetParams1D, node, dst, src, count, kind);
}

inline cudaError_t
cuda_graph_add_memset_node_set_params(cudaGraphNode_t node, const cudaMemsetParams *pMemsetParams) {
    NV_FE_CALL_TO_CUDA(cuda_graph_add_memset_node_set_params, cudaGraphMemsetNodeSetParams, node, pMemsetParams);
}

inline cudaError_t
cuda_graph_begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    NV_FE_CALL_TO_CUDA(cuda_graph_begin_capture, cudaStreamBeginCapture, stream, mode);
}

inline CUresult
cu_thread_exchange_stream_capture_mode(CUstreamCaptureMode *mode) {
    NV_FE_CALL_TO_CU(cu_thread_exchange_stream_capture_mode, cuThreadExchangeStreamCaptureMode, mode);
}

inline cudaError_t
cuda_stream_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus *capture_status) {
    NV_FE_CALL_TO_CUDA(cuda_stream_is_capturing, cudaStreamIsCapturing, stream, capture_status);
}

inline cudaError_t
cuda_thread_exchange_stream_capture_mode(cudaStreamCaptureMode *mode) {
    NV_FE_CALL_TO_CUDA(cuda_thread_exchange_stream_capture_mode, cudaThreadExchangeStreamCaptureMode, mode);
}

// cudaStreamGetCaptureInfo: CUDA 12 exports the graph-returning variant as
// cudaStreamGetCaptureInfo_v2 (6 parameters); CUDA 13 exports it as cudaStreamGetCaptureInfo
// with an additional edge-data out-parameter. The shims mirror the exact prototypes.
#if (CUDART_VERSION >= 13000)
inline cudaError_t
cuda_stream_get_capture_info_v3(cudaStream_t stream,
                                cudaStreamCaptureStatus *captureStatus_out,
                                unsigned long long *id_out,
                                cudaGraph_t *graph_out,
                                const cudaGraphNode_t **dependencies_out,
                                const cudaGraphEdgeData **edgeData_out,
                                size_t *numDependencies_out) {
    NV_FE_CALL_TO_CUDA(cuda_stream_get_capture_info_v3,
                       cudaStreamGetCaptureInfo,
                       stream,
                       captureStatus_out,
                       id_out,
                       graph_out,
                       dependencies_out,
                       edgeData_out,
                       numDependencies_out);
}
#else
inline cudaError_t
cuda_stream_get_capture_info_v2(cudaStream_t stream,
                                cudaStreamCaptureStatus *captureStatus_out,
                                unsigned long long *id_out,
                                cudaGraph_t *graph_out,
                                const cudaGraphNode_t **dependencies_out,
                                size_t *numDependencies_out) {
    NV_FE_CALL_TO_CUDA(cuda_stream_get_capture_info_v2,
                       cudaStreamGetCaptureInfo_v2,
                       stream,
                       captureStatus_out,
                       id_out,
                       graph_out,
                       dependencies_out,
                       numDependencies_out);
}
#endif

// Reports the capture status of `stream` and, when it is capturing, the graph it records into.
inline cudaError_t
cuda_stream_get_capture_info(cudaStream_t stream, cudaStreamCaptureStatus *capture_status, cudaGraph_t *graph) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    // Pick the prototype of the loaded runtime; on CUDA 12 the unversioned symbol is the legacy
    // 3-parameter one that never reports the graph.
    if (loaded_cudart_version() >= 13000) {
        using Fn = cudaError_t (*)(cudaStream_t,
                                   cudaStreamCaptureStatus *,
                                   unsigned long long *,
                                   cudaGraph_t *,
                                   const cudaGraphNode_t **,
                                   const void **,
                                   size_t *);
        return reinterpret_cast<Fn>(get_cuda_symbol(CudaLibrary::CUDART, "cudaStreamGetCaptureInfo"))(
            stream, capture_status, nullptr, graph, nullptr, nullptr, nullptr);
    }
    using Fn = cudaError_t (*)(cudaStream_t,
                               cudaStreamCaptureStatus *,
                               unsigned long long *,
                               cudaGraph_t *,
                               const cudaGraphNode_t **,
                               size_t *);
    return reinterpret_cast<Fn>(get_cuda_symbol(CudaLibrary::CUDART, "cudaStreamGetCaptureInfo_v2"))(
        stream, capture_status, nullptr, graph, nullptr, nullptr);
#elif (CUDART_VERSION >= 13000)
    return cuda_stream_get_capture_info_v3(stream, capture_status, nullptr, graph, nullptr, nullptr, nullptr);
#else
    return cuda_stream_get_capture_info_v2(stream, capture_status, nullptr, graph, nullptr, nullptr);
#endif
}

inline cudaError_t
cuda_user_object_create(cudaUserObject_t *object_out,
                        void *ptr,
                        cudaHostFn_t destroy,
                        unsigned int initialRefcount,
                        unsigned int flags) {
    NV_FE_CALL_TO_CUDA(cuda_user_object_create, cudaUserObjectCreate, object_out, ptr, destroy, initialRefcount, flags);
}

inline cudaError_t
cuda_user_object_release(cudaUserObject_t object, unsigned int count) {
    NV_FE_CALL_TO_CUDA(cuda_user_object_release, cudaUserObjectRelease, object, count);
}

inline cudaError_t
cuda_graph_retain_user_object(cudaGraph_t graph, cudaUserObject_t object, unsigned int count, unsigned int flags) {
    NV_FE_CALL_TO_CUDA(cuda_graph_retain_user_object, cudaGraphRetainUserObject, graph, object, count, flags);
}

inline cudaError_t
cuda_get_last_error() {
    NV_FE_CALL_TO_CUDA(cuda_get_last_error, cudaGetLastError);
}

inline cudaError_t
cuda_stream_create(cudaStream_t *stream) {
    NV_FE_CALL_TO_CUDA(cuda_stream_create, cudaStreamCreate, stream);
}

inline cudaError_t
cuda_stream_destroy(cudaStream_t stream) {
    NV_FE_CALL_TO_CUDA(cuda_stream_destroy, cudaStreamDestroy, stream);
}

inline cudaError_t
cuda_graph_end_capture(cudaStream_t stream, cudaGraph_t *graph) {
    NV_FE_CALL_TO_CUDA(cuda_graph_end_capture, cudaStreamEndCapture, stream, graph);
}

inline cudaError_t
cuda_graph_destroy(cudaGraph_t graph) {
    NV_FE_CALL_TO_CUDA(cuda_graph_destroy, cudaGraphDestroy, graph);
}

inline cudaError_t
cuda_event_create(cudaEvent_t *event) {
    NV_FE_CALL_TO_CUDA(cuda_event_create, cudaEventCreate, event);
}

inline cudaError_t
cuda_event_destroy(cudaEvent_t event) {
    NV_FE_CALL_TO_CUDA(cuda_event_destroy, cudaEventDestroy, event);
}

inline cudaError_t
cuda_event_record(cudaEvent_t event, cudaStream_t stream) {
    NV_FE_CALL_TO_CUDA(cuda_event_record, cudaEventRecord, event, stream);
}

inline cudaError_t
cuda_event_synchronize(cudaEvent_t event) {
    NV_FE_CALL_TO_CUDA(cuda_event_synchronize, cudaEventSynchronize, event);
}

inline cudaError_t
cuda_event_elapsed_time(float *ms, cudaEvent_t start, cudaEvent_t end) {
    NV_FE_CALL_TO_CUDA(cuda_event_elapsed_time, cudaEventElapsedTime, ms, start, end);
}

inline cudaError_t
cuda_mem_cpy_async(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
    NV_FE_CALL_TO_CUDA(cuda_mem_cpy_async, cudaMemcpyAsync, dst, src, count, kind, stream);
}

inline cudaError_t
cuda_mem_set_async(void *devPtr, int value, size_t count, cudaStream_t stream) {
    NV_FE_CALL_TO_CUDA(cuda_mem_set_async, cudaMemsetAsync, devPtr, value, count, stream);
}

// The cudaDeviceProp layout differs between CUDA majors, so with dynamic loading it is only valid when
// the loaded runtime matches CUDART_VERSION; prefer cuda_device_get_attribute() (#1563).
inline cudaError_t
cuda_get_device_properties(cudaDeviceProp *prop, int device) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING && CUDART_VERSION >= 12000 && CUDART_VERSION < 13000
    // CUDA 12 headers map cudaGetDeviceProperties to the _v2 symbol; the unversioned one fills the CUDA 11 layout.
    if (loaded_cudart_version() < 13000) {
        NV_FE_CALL_TO_CUDA(cuda_get_device_properties, cudaGetDeviceProperties_v2, prop, device);
    }
#endif
    NV_FE_CALL_TO_CUDA(cuda_get_device_properties, cudaGetDeviceProperties, prop, device);
}

inline cudaError_t
cuda_device_get_attribute(int *value, cudaDeviceAttr attr, int device) {
    NV_FE_CALL_TO_CUDA(cuda_device_get_attribute, cudaDeviceGetAttribute, value, attr, device);
}

inline cudaError_t
cuda_get_device(int *device) {
    NV_FE_CALL_TO_CUDA(cuda_get_device, cudaGetDevice, device);
}

// Driver entry points resolved through the runtime, so the front end never links
// libcuda.so -- the same approach as cu_tensor_map_encode_tiled(). Returns
// nullptr when the entry point is unavailable.
inline void *
get_driver_entry_point(const char *name) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12000
    void *pfn = nullptr;
    cudaDriverEntryPointQueryResult query_result;
    cudaError_t err;
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#if CUDART_VERSION >= 12080
    using GetEntryPointFn =
        cudaError_t (*)(const char *, void **, unsigned int, int, cudaDriverEntryPointQueryResult *);
    const char *resolver = "cudaGetDriverEntryPointByVersion";
#else
    using GetEntryPointFn =
        cudaError_t (*)(const char *, void **, unsigned long long, cudaDriverEntryPointQueryResult *);
    const char *resolver = "cudaGetDriverEntryPoint";
#endif
    GetEntryPointFn get_entry_point = nullptr;
    // get_cuda_symbol throws when the library or symbol is missing; this lookup is
    // best-effort and runs inside a static initializer, so it must not escape.
#ifndef NV_CUDNN_DISABLE_EXCEPTION
    try {
        get_entry_point = reinterpret_cast<GetEntryPointFn>(get_cuda_symbol(CudaLibrary::CUDART, resolver));
    } catch (...) {
        return nullptr;
    }
#else
    get_entry_point = reinterpret_cast<GetEntryPointFn>(get_cuda_symbol(CudaLibrary::CUDART, resolver));
#endif
    if (get_entry_point == nullptr) {
        return nullptr;
    }
#if CUDART_VERSION >= 12080
    err = get_entry_point(name, &pfn, 12000, cudaEnableDefault, &query_result);
#else
    err = get_entry_point(name, &pfn, cudaEnableDefault, &query_result);
#endif
#elif CUDART_VERSION >= 12080
    err = cudaGetDriverEntryPointByVersion(name, &pfn, 12000, cudaEnableDefault, &query_result);
#else
    err = cudaGetDriverEntryPoint(name, &pfn, cudaEnableDefault, &query_result);
#endif
    if (err != cudaSuccess || query_result != cudaDriverEntryPointSuccess) {
        return nullptr;
    }
    return pfn;
#else
    (void)name;
    return nullptr;
#endif
}

// True when the calling thread already has a context. One driver call, so the
// execute path can skip the rest -- including the stream query -- in the steady
// state.
inline bool
has_current_context() {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12000
    using PfnCtxGetCurrent            = CUresult(CUDAAPI *)(CUcontext *);
    static const auto ctx_get_current = reinterpret_cast<PfnCtxGetCurrent>(get_driver_entry_point("cuCtxGetCurrent"));
    if (ctx_get_current == nullptr) {
        return true;  // cannot tell; leave the thread alone
    }
    CUcontext current = nullptr;
    return ctx_get_current(&current) == CUDA_SUCCESS && current != nullptr;
#else
    return true;
#endif
}

// Bind a driver context to the calling thread when it has none: a driver-API
// launch reads that stack, and a thread that has done no CUDA work has nothing
// on it (a PyTorch autograd worker). A bound context is left alone -- it is
// process-wide and the caller chose it. A real stream names the right context;
// the default-stream handles name none, so the runtime's device decides there.
// Best-effort: what this cannot establish fails at the launch.
inline void
ensure_current_context(cudaStream_t stream) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12000
    using PfnCtxGetCurrent    = CUresult(CUDAAPI *)(CUcontext *);
    using PfnCtxSetCurrent    = CUresult(CUDAAPI *)(CUcontext);
    using PfnStreamGetCtx     = CUresult(CUDAAPI *)(CUstream, CUcontext *);
    using PfnDeviceGet        = CUresult(CUDAAPI *)(CUdevice *, int);
    using PfnPrimaryCtxRetain = CUresult(CUDAAPI *)(CUcontext *, CUdevice);

    // Thread-safe static initialization (C++11): the lookups happen once.
    static const auto ctx_get_current = reinterpret_cast<PfnCtxGetCurrent>(get_driver_entry_point("cuCtxGetCurrent"));
    static const auto ctx_set_current = reinterpret_cast<PfnCtxSetCurrent>(get_driver_entry_point("cuCtxSetCurrent"));
    static const auto stream_get_ctx  = reinterpret_cast<PfnStreamGetCtx>(get_driver_entry_point("cuStreamGetCtx"));
    static const auto device_get      = reinterpret_cast<PfnDeviceGet>(get_driver_entry_point("cuDeviceGet"));
    static const auto primary_retain =
        reinterpret_cast<PfnPrimaryCtxRetain>(get_driver_entry_point("cuDevicePrimaryCtxRetain"));
    if (ctx_get_current == nullptr || ctx_set_current == nullptr) {
        return;
    }

    CUcontext current = nullptr;
    if (ctx_get_current(&current) == CUDA_SUCCESS && current != nullptr) {
        return;
    }

    const bool names_a_context = stream != nullptr && stream != reinterpret_cast<cudaStream_t>(CU_STREAM_LEGACY) &&
                                 stream != reinterpret_cast<cudaStream_t>(CU_STREAM_PER_THREAD);
    if (names_a_context && stream_get_ctx != nullptr) {
        CUcontext stream_ctx = nullptr;
        if (stream_get_ctx(reinterpret_cast<CUstream>(stream), &stream_ctx) == CUDA_SUCCESS && stream_ctx != nullptr) {
            ctx_set_current(stream_ctx);
            return;
        }
    }

    if (device_get == nullptr || primary_retain == nullptr) {
        return;
    }
    int ordinal = 0;
    if (cuda_get_device(&ordinal) != cudaSuccess) {
        return;
    }
    CUdevice device = 0;
    if (device_get(&device, ordinal) != CUDA_SUCCESS) {
        return;
    }
    // Retained for the process lifetime, like the primary context itself.
    CUcontext primary = nullptr;
    if (primary_retain(&primary, device) == CUDA_SUCCESS) {
        ctx_set_current(primary);
    }
#else
    (void)stream;
#endif
}

inline cudaError_t
cuda_pointer_get_attributes(cudaPointerAttributes *attributes, const void *ptr) {
    NV_FE_CALL_TO_CUDA(cuda_pointer_get_attributes, cudaPointerGetAttributes, attributes, ptr);
}

inline const char *
cuda_get_error_string(cudaError_t error) {
    NV_FE_CALL_TO_CUDA(cuda_get_error_string, cudaGetErrorString, error);
}

inline cudaError_t
cuda_device_synchronize() {
    NV_FE_CALL_TO_CUDA(cuda_device_synchronize, cudaDeviceSynchronize);
}

inline cudaError_t
cuda_stream_synchronize(cudaStream_t stream) {
    NV_FE_CALL_TO_CUDA(cuda_stream_synchronize, cudaStreamSynchronize, stream);
}

inline cudaError_t
cuda_malloc(void **ptr, size_t sz) {
    NV_FE_CALL_TO_CUDA(cuda_malloc, cudaMalloc, ptr, sz);
}

inline cudaError_t
cuda_free(void *ptr) {
    NV_FE_CALL_TO_CUDA(cuda_free, cudaFree, ptr);
}

inline cudnnStatus_t
create_handle(cudnnHandle_t *handle) {
    NV_FE_CALL_TO_BACKEND(create_handle, cudnnCreate, handle);
}

inline cudnnStatus_t
destroy_handle(cudnnHandle_t handle) {
    NV_FE_CALL_TO_BACKEND(destroy_handle, cudnnDestroy, handle);
}

#if CUDNN_VERSION >= 92200
inline cudnnStatus_t
causal_conv1d_forward(cudaStream_t stream,
                      const void *x,
                      const void *weight,
                      const void *bias,
                      void *y,
                      int batch,
                      int dim,
                      int seq_len,
                      int kernel_size,
                      cudnnDataType_t data_type,
                      cudnnCausalConv1dActivation_t activation) {
    NV_FE_CALL_TO_BACKEND(causal_conv1d_forward,
                          cudnnCausalConv1dForward,
                          stream,
                          x,
                          weight,
                          bias,
                          y,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          activation);
}

inline cudnnStatus_t
causal_conv1d_backward(cudaStream_t stream,
                       const void *x,
                       const void *weight,
                       const void *bias,
                       const void *dy,
                       void *dx,
                       void *dweight,
                       void *dbias,
                       int batch,
                       int dim,
                       int seq_len,
                       int kernel_size,
                       cudnnDataType_t data_type,
                       cudnnDataType_t dw_data_type,
                       cudnnCausalConv1dActivation_t activation) {
    NV_FE_CALL_TO_BACKEND(causal_conv1d_backward,
                          cudnnCausalConv1dBackward,
                          stream,
                          x,
                          weight,
                          bias,
                          dy,
                          dx,
                          dweight,
                          dbias,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          dw_data_type,
                          activation);
}
#endif

inline size_t
get_backend_version(void) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    static void *fptr = get_symbol("cudnnGetVersion");
    if (fptr == nullptr) {
        throw std::runtime_error("Unable to find symbol cudnnGetVersion");
    }
    return reinterpret_cast<decltype(get_backend_version) *>(fptr)();
#else
    return cudnnGetVersion();
#endif
}

inline constexpr size_t
get_compiled_version(void) {
    return CUDNN_VERSION;
}

#if !defined(_WIN32)

// Version-neutral ABI definitions for direct-call GNN APIs. The Python extension
// dynamically resolves these APIs, so its exported bindings must not depend on
// the cuDNN headers that happened to be installed when the extension was built.
enum class gnn_activation_op_t : std::int32_t {
    LINEAR     = 0,
    RELU       = 1,
    SIGMOID    = 2,
    TANH       = 3,
    ELU        = 4,
    SCALAR     = 5,
    LEAKY_RELU = 6,
};

struct gnn_csc_graph_t {
    const void *csc_offsets;
    const void *csc_indices;
    const void *map_csc_to_coo;
    const void *map_rev_to_coo;
    std::int64_t n_src_nodes;
    std::int64_t n_dst_nodes;
    std::int64_t n_indices;
    cudnnDataType_t idx_type;
    const void *csc_rev_offsets;
};

struct gnn_mha_params_t {
    gnn_activation_op_t activation;
    float activation_alpha;
    int num_heads;
    int concat_heads;
};

static_assert(std::is_standard_layout_v<gnn_csc_graph_t>);
static_assert(std::is_standard_layout_v<gnn_mha_params_t>);

#if CUDNN_VERSION >= 92600
static_assert(offsetof(gnn_csc_graph_t, csc_offsets) == offsetof(cudnnGnnCscGraph_t, cscOffsets));
static_assert(offsetof(gnn_csc_graph_t, csc_indices) == offsetof(cudnnGnnCscGraph_t, cscIndices));
static_assert(offsetof(gnn_csc_graph_t, map_csc_to_coo) == offsetof(cudnnGnnCscGraph_t, mapCscToCoo));
static_assert(offsetof(gnn_csc_graph_t, map_rev_to_coo) == offsetof(cudnnGnnCscGraph_t, mapRevToCoo));
static_assert(offsetof(gnn_csc_graph_t, n_src_nodes) == offsetof(cudnnGnnCscGraph_t, nSrcNodes));
static_assert(offsetof(gnn_csc_graph_t, n_dst_nodes) == offsetof(cudnnGnnCscGraph_t, nDstNodes));
static_assert(offsetof(gnn_csc_graph_t, n_indices) == offsetof(cudnnGnnCscGraph_t, nIndices));
static_assert(offsetof(gnn_csc_graph_t, idx_type) == offsetof(cudnnGnnCscGraph_t, idxType));
#endif

#if CUDNN_VERSION >= 92800
static_assert(sizeof(gnn_csc_graph_t) == sizeof(cudnnGnnCscGraph_t));
static_assert(alignof(gnn_csc_graph_t) == alignof(cudnnGnnCscGraph_t));
static_assert(offsetof(gnn_csc_graph_t, csc_rev_offsets) == offsetof(cudnnGnnCscGraph_t, cscRevOffsets));
static_assert(sizeof(gnn_mha_params_t) == sizeof(cudnnGnnMhaParams_t));
static_assert(alignof(gnn_mha_params_t) == alignof(cudnnGnnMhaParams_t));
static_assert(offsetof(gnn_mha_params_t, activation) == offsetof(cudnnGnnMhaParams_t, activation));
static_assert(offsetof(gnn_mha_params_t, activation_alpha) == offsetof(cudnnGnnMhaParams_t, activationAlpha));
static_assert(offsetof(gnn_mha_params_t, num_heads) == offsetof(cudnnGnnMhaParams_t, numHeads));
static_assert(offsetof(gnn_mha_params_t, concat_heads) == offsetof(cudnnGnnMhaParams_t, concatHeads));
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::LINEAR) == CUDNN_GNN_ACT_LINEAR);
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::RELU) == CUDNN_GNN_ACT_RELU);
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::SIGMOID) == CUDNN_GNN_ACT_SIGMOID);
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::TANH) == CUDNN_GNN_ACT_TANH);
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::ELU) == CUDNN_GNN_ACT_ELU);
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::SCALAR) == CUDNN_GNN_ACT_SCALAR);
static_assert(static_cast<std::int32_t>(gnn_activation_op_t::LEAKY_RELU) == CUDNN_GNN_ACT_LEAKY_RELU);
#endif

#if CUDNN_VERSION >= 92600
inline cudnnStatus_t
gnn_agg_simple_forward(cudaStream_t stream,
                       const gnn_csc_graph_t *graph,
                       const void *node_features,
                       const void *edge_features,
                       const void *concat_features,
                       void *output,
                       void *out_positions,
                       int node_feat_dim,
                       int edge_feat_dim,
                       int concat_feat_dim,
                       cudnnDataType_t data_type,
                       cudnnGnnAggOp_t agg_op) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    NV_FE_CALL_TO_BACKEND(gnn_agg_simple_forward,
                          cudnnGnnAggSimpleForward,
                          stream,
                          graph,
                          node_features,
                          edge_features,
                          concat_features,
                          output,
                          out_positions,
                          node_feat_dim,
                          edge_feat_dim,
                          concat_feat_dim,
                          data_type,
                          agg_op);
#else
    return cudnnGnnAggSimpleForward(stream,
                                    reinterpret_cast<const cudnnGnnCscGraph_t *>(graph),
                                    node_features,
                                    edge_features,
                                    concat_features,
                                    output,
                                    out_positions,
                                    node_feat_dim,
                                    edge_feat_dim,
                                    concat_feat_dim,
                                    data_type,
                                    agg_op);
#endif
}

inline cudnnStatus_t
gnn_agg_simple_backward(cudaStream_t stream,
                        const gnn_csc_graph_t *graph,
                        const void *grad_output,
                        const void *out_positions,
                        void *grad_node_features,
                        void *grad_edge_features,
                        void *grad_concat_features,
                        int node_feat_dim,
                        int edge_feat_dim,
                        int concat_feat_dim,
                        cudnnDataType_t data_type,
                        cudnnGnnAggOp_t agg_op) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    NV_FE_CALL_TO_BACKEND(gnn_agg_simple_backward,
                          cudnnGnnAggSimpleBackward,
                          stream,
                          graph,
                          grad_output,
                          out_positions,
                          grad_node_features,
                          grad_edge_features,
                          grad_concat_features,
                          node_feat_dim,
                          edge_feat_dim,
                          concat_feat_dim,
                          data_type,
                          agg_op);
#else
    return cudnnGnnAggSimpleBackward(stream,
                                     reinterpret_cast<const cudnnGnnCscGraph_t *>(graph),
                                     grad_output,
                                     out_positions,
                                     grad_node_features,
                                     grad_edge_features,
                                     grad_concat_features,
                                     node_feat_dim,
                                     edge_feat_dim,
                                     concat_feat_dim,
                                     data_type,
                                     agg_op);
#endif
}
#endif

inline cudnnStatus_t
gnn_mha_gat_forward(cudaStream_t stream,
                    const gnn_csc_graph_t *graph,
                    const void *src_features,
                    const void *dst_features,
                    const void *edge_features,
                    const void *attn_weights,
                    const float *dropout_mask,
                    void *output,
                    void *sm_scores,
                    int node_feat_dim,
                    int edge_feat_dim,
                    const gnn_mha_params_t *params,
                    cudnnDataType_t data_type) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    if (get_backend_version() < 92800) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(gnn_mha_gat_forward,
                          cudnnGnnMhaGatForward,
                          stream,
                          graph,
                          src_features,
                          dst_features,
                          edge_features,
                          attn_weights,
                          dropout_mask,
                          output,
                          sm_scores,
                          node_feat_dim,
                          edge_feat_dim,
                          params,
                          data_type);
#elif CUDNN_VERSION >= 92800
    return cudnnGnnMhaGatForward(stream,
                                 reinterpret_cast<const cudnnGnnCscGraph_t *>(graph),
                                 src_features,
                                 dst_features,
                                 edge_features,
                                 attn_weights,
                                 dropout_mask,
                                 output,
                                 sm_scores,
                                 node_feat_dim,
                                 edge_feat_dim,
                                 reinterpret_cast<const cudnnGnnMhaParams_t *>(params),
                                 data_type);
#else
    (void)stream;
    (void)graph;
    (void)src_features;
    (void)dst_features;
    (void)edge_features;
    (void)attn_weights;
    (void)dropout_mask;
    (void)output;
    (void)sm_scores;
    (void)node_feat_dim;
    (void)edge_feat_dim;
    (void)params;
    (void)data_type;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

inline cudnnStatus_t
gnn_mha_gat_backward(cudaStream_t stream,
                     const gnn_csc_graph_t *graph,
                     const void *grad_output,
                     const void *src_features,
                     const void *dst_features,
                     const void *edge_features,
                     const void *attn_weights,
                     const void *sm_scores,
                     const float *dropout_mask,
                     const float *grad_attention,
                     void *grad_src_features,
                     void *grad_dst_features,
                     void *grad_edge_features,
                     void *grad_weights,
                     void *grad_sm_scores,
                     void *grad_workspace_features,
                     void *grad_workspace_weights,
                     int node_feat_dim,
                     int edge_feat_dim,
                     const gnn_mha_params_t *params,
                     cudnnDataType_t data_type,
                     cudnnDataType_t grad_data_type,
                     cudnnDataType_t grad_weight_type) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    if (get_backend_version() < 92800) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(gnn_mha_gat_backward,
                          cudnnGnnMhaGatBackward,
                          stream,
                          graph,
                          grad_output,
                          src_features,
                          dst_features,
                          edge_features,
                          attn_weights,
                          sm_scores,
                          dropout_mask,
                          grad_attention,
                          grad_src_features,
                          grad_dst_features,
                          grad_edge_features,
                          grad_weights,
                          grad_sm_scores,
                          grad_workspace_features,
                          grad_workspace_weights,
                          node_feat_dim,
                          edge_feat_dim,
                          params,
                          data_type,
                          grad_data_type,
                          grad_weight_type);
#elif CUDNN_VERSION >= 92800
    return cudnnGnnMhaGatBackward(stream,
                                  reinterpret_cast<const cudnnGnnCscGraph_t *>(graph),
                                  grad_output,
                                  src_features,
                                  dst_features,
                                  edge_features,
                                  attn_weights,
                                  sm_scores,
                                  dropout_mask,
                                  grad_attention,
                                  grad_src_features,
                                  grad_dst_features,
                                  grad_edge_features,
                                  grad_weights,
                                  grad_sm_scores,
                                  grad_workspace_features,
                                  grad_workspace_weights,
                                  node_feat_dim,
                                  edge_feat_dim,
                                  reinterpret_cast<const cudnnGnnMhaParams_t *>(params),
                                  data_type,
                                  grad_data_type,
                                  grad_weight_type);
#else
    (void)stream;
    (void)graph;
    (void)grad_output;
    (void)src_features;
    (void)dst_features;
    (void)edge_features;
    (void)attn_weights;
    (void)sm_scores;
    (void)dropout_mask;
    (void)grad_attention;
    (void)grad_src_features;
    (void)grad_dst_features;
    (void)grad_edge_features;
    (void)grad_weights;
    (void)grad_sm_scores;
    (void)grad_workspace_features;
    (void)grad_workspace_weights;
    (void)node_feat_dim;
    (void)edge_feat_dim;
    (void)params;
    (void)data_type;
    (void)grad_data_type;
    (void)grad_weight_type;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

inline cudnnStatus_t
gnn_mha_gat_v2_forward(cudaStream_t stream,
                       const gnn_csc_graph_t *graph,
                       const void *src_features,
                       const void *dst_features,
                       const void *edge_features,
                       const void *attn_weights,
                       const float *dropout_mask,
                       void *output,
                       void *sm_scores,
                       void *act_scores,
                       int node_feat_dim,
                       const gnn_mha_params_t *params,
                       cudnnDataType_t data_type) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    if (get_backend_version() < 92800) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(gnn_mha_gat_v2_forward,
                          cudnnGnnMhaGatV2Forward,
                          stream,
                          graph,
                          src_features,
                          dst_features,
                          edge_features,
                          attn_weights,
                          dropout_mask,
                          output,
                          sm_scores,
                          act_scores,
                          node_feat_dim,
                          params,
                          data_type);
#elif CUDNN_VERSION >= 92800
    return cudnnGnnMhaGatV2Forward(stream,
                                   reinterpret_cast<const cudnnGnnCscGraph_t *>(graph),
                                   src_features,
                                   dst_features,
                                   edge_features,
                                   attn_weights,
                                   dropout_mask,
                                   output,
                                   sm_scores,
                                   act_scores,
                                   node_feat_dim,
                                   reinterpret_cast<const cudnnGnnMhaParams_t *>(params),
                                   data_type);
#else
    (void)stream;
    (void)graph;
    (void)src_features;
    (void)dst_features;
    (void)edge_features;
    (void)attn_weights;
    (void)dropout_mask;
    (void)output;
    (void)sm_scores;
    (void)act_scores;
    (void)node_feat_dim;
    (void)params;
    (void)data_type;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

inline cudnnStatus_t
gnn_mha_gat_v2_backward(cudaStream_t stream,
                        const gnn_csc_graph_t *graph,
                        const void *grad_output,
                        const void *src_features,
                        const void *dst_features,
                        const void *edge_features,
                        const void *attn_weights,
                        const void *sm_scores,
                        const void *act_scores,
                        const float *dropout_mask,
                        const float *grad_attention,
                        void *grad_src_features,
                        void *grad_dst_features,
                        void *grad_edge_features,
                        void *grad_weights,
                        void *grad_sm_scores,
                        void *grad_workspace_features,
                        void *grad_workspace_weights,
                        int node_feat_dim,
                        const gnn_mha_params_t *params,
                        cudnnDataType_t data_type,
                        cudnnDataType_t grad_type) {
#if defined NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    if (get_backend_version() < 92800) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(gnn_mha_gat_v2_backward,
                          cudnnGnnMhaGatV2Backward,
                          stream,
                          graph,
                          grad_output,
                          src_features,
                          dst_features,
                          edge_features,
                          attn_weights,
                          sm_scores,
                          act_scores,
                          dropout_mask,
                          grad_attention,
                          grad_src_features,
                          grad_dst_features,
                          grad_edge_features,
                          grad_weights,
                          grad_sm_scores,
                          grad_workspace_features,
                          grad_workspace_weights,
                          node_feat_dim,
                          params,
                          data_type,
                          grad_type);
#elif CUDNN_VERSION >= 92800
    return cudnnGnnMhaGatV2Backward(stream,
                                    reinterpret_cast<const cudnnGnnCscGraph_t *>(graph),
                                    grad_output,
                                    src_features,
                                    dst_features,
                                    edge_features,
                                    attn_weights,
                                    sm_scores,
                                    act_scores,
                                    dropout_mask,
                                    grad_attention,
                                    grad_src_features,
                                    grad_dst_features,
                                    grad_edge_features,
                                    grad_weights,
                                    grad_sm_scores,
                                    grad_workspace_features,
                                    grad_workspace_weights,
                                    node_feat_dim,
                                    reinterpret_cast<const cudnnGnnMhaParams_t *>(params),
                                    data_type,
                                    grad_type);
#else
    (void)stream;
    (void)graph;
    (void)grad_output;
    (void)src_features;
    (void)dst_features;
    (void)edge_features;
    (void)attn_weights;
    (void)sm_scores;
    (void)act_scores;
    (void)dropout_mask;
    (void)grad_attention;
    (void)grad_src_features;
    (void)grad_dst_features;
    (void)grad_edge_features;
    (void)grad_weights;
    (void)grad_sm_scores;
    (void)grad_workspace_features;
    (void)grad_workspace_weights;
    (void)node_feat_dim;
    (void)params;
    (void)data_type;
    (void)grad_type;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}
#endif

#if CUDNN_VERSION >= 92200
inline cudnnStatus_t
causal_conv1d_nwh_forward(cudaStream_t stream,
                          const void *x,
                          const void *weight,
                          const void *bias,
                          void *y,
                          int batch,
                          int dim,
                          int seq_len,
                          int kernel_size,
                          cudnnDataType_t data_type,
                          cudnnCausalConv1dActivation_t activation) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92400) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
#if CUDNN_VERSION >= 92400
    NV_FE_CALL_TO_BACKEND(causal_conv1d_nwh_forward,
                          cudnnCausalConv1dNwhForward,
                          stream,
                          x,
                          weight,
                          bias,
                          y,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          activation);
#else
    (void)stream;
    (void)x;
    (void)weight;
    (void)bias;
    (void)y;
    (void)batch;
    (void)dim;
    (void)seq_len;
    (void)kernel_size;
    (void)data_type;
    (void)activation;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

inline cudnnStatus_t
causal_conv1d_nwh_backward(cudaStream_t stream,
                           const void *x,
                           const void *weight,
                           const void *bias,
                           const void *dy,
                           void *dx,
                           void *dweight,
                           void *dbias,
                           int batch,
                           int dim,
                           int seq_len,
                           int kernel_size,
                           cudnnDataType_t data_type,
                           cudnnDataType_t dw_data_type,
                           cudnnCausalConv1dActivation_t activation) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92400) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
#if CUDNN_VERSION >= 92400
    NV_FE_CALL_TO_BACKEND(causal_conv1d_nwh_backward,
                          cudnnCausalConv1dNwhBackward,
                          stream,
                          x,
                          weight,
                          bias,
                          dy,
                          dx,
                          dweight,
                          dbias,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          dw_data_type,
                          activation);
#else
    (void)stream;
    (void)x;
    (void)weight;
    (void)bias;
    (void)dy;
    (void)dx;
    (void)dweight;
    (void)dbias;
    (void)batch;
    (void)dim;
    (void)seq_len;
    (void)kernel_size;
    (void)data_type;
    (void)dw_data_type;
    (void)activation;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

inline cudnnStatus_t
b2b_causal_conv1d_forward(cudaStream_t stream,
                          const void *x,
                          const void *weights_proj,
                          const void *weights_mixer,
                          const void *skip_bias,
                          void *y,
                          void *y_gated,
                          int batch,
                          int dim,
                          int seq_len,
                          int kernel_size_proj,
                          int kernel_size_mixer,
                          cudnnDataType_t data_type) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92400) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
#if CUDNN_VERSION >= 92400
    NV_FE_CALL_TO_BACKEND(b2b_causal_conv1d_forward,
                          cudnnB2BCausalConv1dForward,
                          stream,
                          x,
                          weights_proj,
                          weights_mixer,
                          skip_bias,
                          y,
                          y_gated,
                          batch,
                          dim,
                          seq_len,
                          kernel_size_proj,
                          kernel_size_mixer,
                          data_type);
#else
    (void)stream;
    (void)x;
    (void)weights_proj;
    (void)weights_mixer;
    (void)skip_bias;
    (void)y;
    (void)y_gated;
    (void)batch;
    (void)dim;
    (void)seq_len;
    (void)kernel_size_proj;
    (void)kernel_size_mixer;
    (void)data_type;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}

inline cudnnStatus_t
b2b_causal_conv1d_backward(cudaStream_t stream,
                           const void *x,
                           const void *weights_proj,
                           const void *weights_mixer,
                           const void *skip_bias,
                           const void *y,
                           const void *dy,
                           void *dx,
                           void *dweights_proj,
                           void *dweights_mixer,
                           void *dskip_bias,
                           int batch,
                           int dim,
                           int seq_len,
                           int kernel_size_proj,
                           int kernel_size_mixer,
                           cudnnDataType_t data_type,
                           cudnnDataType_t dw_data_type) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92400) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
#if CUDNN_VERSION >= 92400
    NV_FE_CALL_TO_BACKEND(b2b_causal_conv1d_backward,
                          cudnnB2BCausalConv1dBackward,
                          stream,
                          x,
                          weights_proj,
                          weights_mixer,
                          skip_bias,
                          y,
                          dy,
                          dx,
                          dweights_proj,
                          dweights_mixer,
                          dskip_bias,
                          batch,
                          dim,
                          seq_len,
                          kernel_size_proj,
                          kernel_size_mixer,
                          data_type,
                          dw_data_type);
#else
    (void)stream;
    (void)x;
    (void)weights_proj;
    (void)weights_mixer;
    (void)skip_bias;
    (void)y;
    (void)dy;
    (void)dx;
    (void)dweights_proj;
    (void)dweights_mixer;
    (void)dskip_bias;
    (void)batch;
    (void)dim;
    (void)seq_len;
    (void)kernel_size_proj;
    (void)kernel_size_mixer;
    (void)data_type;
    (void)dw_data_type;
    return CUDNN_STATUS_NOT_SUPPORTED;
#endif
}
#endif

#if CUDNN_VERSION >= 92600
inline cudnnStatus_t
fft_causal_conv1d_forward(cudaStream_t stream,
                          const void *x,
                          const void *weight,
                          void *y,
                          int batch,
                          int dim,
                          int seq_len,
                          int kernel_size,
                          cudnnDataType_t data_type) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92600) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(fft_causal_conv1d_forward,
                          cudnnFFTCausalConv1dForward,
                          stream,
                          x,
                          weight,
                          y,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type);
}

inline cudnnStatus_t
fft_causal_conv1d_backward(cudaStream_t stream,
                           const void *x,
                           const void *weight,
                           const void *dy,
                           void *dx,
                           void *dweight,
                           int batch,
                           int dim,
                           int seq_len,
                           int kernel_size,
                           cudnnDataType_t data_type) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92600) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(fft_causal_conv1d_backward,
                          cudnnFFTCausalConv1dBackward,
                          stream,
                          x,
                          weight,
                          dy,
                          dx,
                          dweight,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type);
}

inline cudnnStatus_t
long_fft_causal_conv1d_get_buffer_sizes(int batch,
                                        int dim,
                                        int seq_len,
                                        int kernel_size,
                                        cudnnDataType_t data_type,
                                        size_t *workspace_size_in_bytes,
                                        size_t *reserve_space_size_in_bytes) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92600) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(long_fft_causal_conv1d_get_buffer_sizes,
                          cudnnLongFFTCausalConv1dGetBufferSizes,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          workspace_size_in_bytes,
                          reserve_space_size_in_bytes);
}

inline cudnnStatus_t
long_fft_causal_conv1d_forward(cudaStream_t stream,
                               const void *x,
                               const void *weight,
                               void *y,
                               int batch,
                               int dim,
                               int seq_len,
                               int kernel_size,
                               cudnnDataType_t data_type,
                               void *workspace,
                               size_t workspace_size_in_bytes,
                               void *reserve_space,
                               size_t reserve_space_size_in_bytes) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92600) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(long_fft_causal_conv1d_forward,
                          cudnnLongFFTCausalConv1dForward,
                          stream,
                          x,
                          weight,
                          y,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          workspace,
                          workspace_size_in_bytes,
                          reserve_space,
                          reserve_space_size_in_bytes);
}

inline cudnnStatus_t
long_fft_causal_conv1d_backward(cudaStream_t stream,
                                const void *dy,
                                void *dx,
                                void *dweight,
                                int batch,
                                int dim,
                                int seq_len,
                                int kernel_size,
                                cudnnDataType_t data_type,
                                void *workspace,
                                size_t workspace_size_in_bytes,
                                void *reserve_space,
                                size_t reserve_space_size_in_bytes) {
    auto effective_cudnn_ver = std::min(detail::get_compiled_version(), detail::get_backend_version());
    if (effective_cudnn_ver < 92600) {
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    NV_FE_CALL_TO_BACKEND(long_fft_causal_conv1d_backward,
                          cudnnLongFFTCausalConv1dBackward,
                          stream,
                          dy,
                          dx,
                          dweight,
                          batch,
                          dim,
                          seq_len,
                          kernel_size,
                          data_type,
                          workspace,
                          workspace_size_in_bytes,
                          reserve_space,
                          reserve_space_size_in_bytes);
}
#endif

inline std::string
convert_version_to_str(size_t const version) {
    // The multiplier for major version pre-v9 and post-v9 are different.
    size_t major = version / 10000;
    size_t minor = (version / 100) % 100;
    if (major == 0) {
        major = version / 1000;
        minor = (version / 100) % 10;
    }
    auto patch = version % 100;

    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

inline std::string
get_backend_version_string() {
    return convert_version_to_str(get_backend_version());
}

inline cudnnStatus_t
create_descriptor(cudnnBackendDescriptorType_t descriptorType, cudnnBackendDescriptor_t *descriptor) {
    NV_FE_CALL_TO_BACKEND(create_descriptor, cudnnBackendCreateDescriptor, descriptorType, descriptor);
}

inline cudnnStatus_t
destroy_descriptor(cudnnBackendDescriptor_t descriptor) {
    NV_FE_CALL_TO_BACKEND(destroy_descriptor, cudnnBackendDestroyDescriptor, descriptor);
}

inline cudnnStatus_t
set_attribute(cudnnBackendDescriptor_t descriptor,
              cudnnBackendAttributeName_t attributeName,
              cudnnBackendAttributeType_t attributeType,
              int64_t elementCount,
              const void *arrayOfElements) {
    NV_FE_CALL_TO_BACKEND(set_attribute,
                          cudnnBackendSetAttribute,
                          descriptor,
                          attributeName,
                          attributeType,
                          elementCount,
                          arrayOfElements);
}

inline cudnnStatus_t
get_attribute(cudnnBackendDescriptor_t const descriptor,
              cudnnBackendAttributeName_t attributeName,
              cudnnBackendAttributeType_t attributeType,
              int64_t requestedElementCount,
              int64_t *elementCount,
              void *arrayOfElements) {
    NV_FE_CALL_TO_BACKEND(get_attribute,
                          cudnnBackendGetAttribute,
                          descriptor,
                          attributeName,
                          attributeType,
                          requestedElementCount,
                          elementCount,
                          arrayOfElements)
}

inline cudnnStatus_t
finalize(cudnnBackendDescriptor_t descriptor) {
    NV_FE_CALL_TO_BACKEND(finalize, cudnnBackendFinalize, descriptor);
}

inline cudnnStatus_t
execute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack) {
    NV_FE_CALL_TO_BACKEND(execute, cudnnBackendExecute, handle, executionPlan, variantPack);
}

inline cudnnStatus_t
get_execution_plan_workspace_size(cudnnHandle_t handle,
                                  cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack,
                                  size_t *workspaceSizeInBytes) {
#if CUDNN_VERSION >= 92300
    NV_FE_CALL_TO_BACKEND(get_execution_plan_workspace_size,
                          cudnnGetExecutionPlanWorkspaceSize,
                          handle,
                          executionPlan,
                          variantPack,
                          workspaceSizeInBytes);
#else
    (void)handle;
    (void)executionPlan;
    (void)variantPack;
    (void)workspaceSizeInBytes;
    return CUDNN_STATUS_VERSION_MISMATCH;
#endif
}

inline cudnnStatus_t
populate_cuda_graph(cudnnHandle_t handle,
                    cudnnBackendDescriptor_t executionPlan,
                    cudnnBackendDescriptor_t variantPack,
                    cudaGraph_t cuda_graph) {
#if CUDNN_VERSION >= 90500
    NV_FE_CALL_TO_BACKEND(
        populate_cuda_graph, cudnnBackendPopulateCudaGraph, handle, executionPlan, variantPack, cuda_graph);
#else
    (void)handle;
    (void)executionPlan;
    (void)variantPack;
    (void)cuda_graph;
    return CUDNN_STATUS_VERSION_MISMATCH;
#endif
}

inline cudnnStatus_t
update_cuda_graph(cudnnHandle_t handle,
                  cudnnBackendDescriptor_t executionPlan,
                  cudnnBackendDescriptor_t variantPack,
                  cudaGraph_t cuda_graph) {
#if CUDNN_VERSION >= 90500
    NV_FE_CALL_TO_BACKEND(
        update_cuda_graph, cudnnBackendUpdateCudaGraph, handle, executionPlan, variantPack, cuda_graph);
#else
    (void)handle;
    (void)executionPlan;
    (void)variantPack;
    (void)cuda_graph;
    return CUDNN_STATUS_VERSION_MISMATCH;
#endif
}

inline const char *
get_error_string(cudnnStatus_t status) {
    NV_FE_CALL_TO_BACKEND(get_error_string, cudnnGetErrorString, status);
}

inline void
get_last_error_string(char *message, size_t size) {
    if (detail::get_backend_version() >= 90000 && detail::get_compiled_version() >= 90000) {
#if CUDNN_VERSION >= 90000
        NV_FE_CALL_TO_BACKEND(get_last_error_string, cudnnGetLastErrorString, message, size);
#endif
    } else {
        std::string default_message = "Can't retrieve backend error messages for CUDNN version < 9.0";
        // strncpy(message, default_message.c_str(), size - 1);
        message[size - 1] = '\0';  // Ensure null terminator at the end of the string
    }
}

inline std::string
get_last_error_string_() {
    const size_t size = 65535;

    std::string message;

    message.resize(size);

    get_last_error_string(message.data(), size);

    message.resize(std::strlen(message.c_str()));

    return message;
}

inline cudnnStatus_t
set_stream(cudnnHandle_t handle, cudaStream_t stream) {
    NV_FE_CALL_TO_BACKEND(set_stream, cudnnSetStream, handle, stream);
}

inline cudnnStatus_t
get_stream(cudnnHandle_t handle, cudaStream_t *stream) {
    NV_FE_CALL_TO_BACKEND(get_stream, cudnnGetStream, handle, stream);
}

inline cudnnStatus_t
create_filter_desc_v7(cudnnFilterDescriptor_t *filter) {
    NV_FE_CALL_TO_BACKEND(create_filter_desc_v7, cudnnCreateFilterDescriptor, filter);
}

inline cudnnStatus_t
set_ndfilter_desc_v7(cudnnFilterDescriptor_t filter,
                     cudnnDataType_t type,
                     cudnnTensorFormat_t format,
                     int x,
                     const int filterDimA[]) {
    NV_FE_CALL_TO_BACKEND(set_ndfilter_desc_v7, cudnnSetFilterNdDescriptor, filter, type, format, x, filterDimA);
}

inline cudnnStatus_t
reorder_filter_bias(cudnnHandle_t handle,
                    const cudnnFilterDescriptor_t filterDesc,
                    cudnnReorderType_t reorderType,
                    const void *filterData,
                    void *reorderedFilterData,
                    int reorderBias,
                    const void *biasData,
                    void *reorderedBiasData) {
    NV_FE_CALL_TO_BACKEND(reorder_filter_bias,
                          cudnnReorderFilterAndBias,
                          handle,
                          filterDesc,
                          reorderType,
                          filterData,
                          reorderedFilterData,
                          reorderBias,
                          biasData,
                          reorderedBiasData);
}

inline cudnnStatus_t
destroy_filter(cudnnFilterDescriptor_t filter) {
    NV_FE_CALL_TO_BACKEND(destroy_filter, cudnnDestroyFilterDescriptor, filter);
}

}  // namespace detail
}  // namespace cudnn_frontend
