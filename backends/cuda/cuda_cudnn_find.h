/* Where lpx-cuda looks for libcudnn.so.9 (cuda_cudnn_find.c; docs/GPU.md,
 * "Attention"). Plain C, no CUDA: the search order is a pure function over
 * a list of paths, tested on the CPU (tests/test_cudnn_find.c).
 *
 * Order:
 *  1. dlopen("libcudnn.so.9"): the dynamic loader's own search (a copy
 *     already in the process, e.g. torch's, matched by soname;
 *     LD_LIBRARY_PATH; the ld.so cache);
 *  2. LPX_CUDNN_PATH, when set: ':'-separated entries, each a directory
 *     holding libcudnn.so.9 or a file whose name starts with "libcudnn";
 *  3. the nvidia/cudnn/lib folder of every Python site-packages (or
 *     dist-packages) directory that a library already loaded in the
 *     process lives under (dl_iterate_phdr: torch's libtorch_cuda.so,
 *     the lpx wheel's own lpx-cuda.so in site-packages/lpx/_lib, ...),
 *     in load order: where pip puts nvidia-cudnn-cu12/cu13, torch's
 *     dependency. No Python is run.
 * The first that loads wins. */
#ifndef LPX_CUDA_CUDNN_FIND_H
#define LPX_CUDA_CUDNN_FIND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_CUDNN_NAME "libcudnn.so.9"
#define CU_CUDNN_PATH_MAX 1024
#define CU_CUDNN_MAX_CANDIDATES 48

typedef void *(*cu_dlopen_fn)(const char *file, int flags);
typedef char *(*cu_dlerror_fn)(void);

/* The candidates of the search above, in order and without repeats, into
 * out (at most max_out; longer paths are left out): CU_CUDNN_NAME, then
 * LPX_CUDNN_PATH's entries (env_path; NULL when unset), then the
 * site-packages folders derived from the n_loaded paths of loaded. Returns
 * the count. */
size_t cu_cudnn_candidates(const char *env_path, const char *const *loaded, size_t n_loaded,
                           char (*out)[CU_CUDNN_PATH_MAX], size_t max_out);

/* The site-packages (or dist-packages) folders, with their trailing
 * slash, that the objects loaded in this process live under
 * (dl_iterate_phdr, in load order, each once), at most max. Each is a
 * valid `loaded` path for cu_cudnn_candidates. */
size_t cu_loaded_objects(char (*out)[CU_CUDNN_PATH_MAX], size_t max);

/* Tries the candidates in order with open_fn(path, flags) (dlopen; a test
 * passes its own) and returns the first handle, its candidate in chosen;
 * NULL when none loads. An absolute candidate that does not exist is not
 * opened. looked (always written) lists every candidate tried before the
 * one that loaded, each with why it did not ("absent", the loader's
 * error), and says whether LPX_CUDNN_PATH was set. */
void *cu_cudnn_open(cu_dlopen_fn open_fn, cu_dlerror_fn error_fn, int flags, const char *env_path,
                    const char *const *loaded, size_t n_loaded, char *chosen, size_t chosen_n, char *looked,
                    size_t looked_n);

#ifdef __cplusplus
}
#endif

#endif
