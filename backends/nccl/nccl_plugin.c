/* lpx-nccl.so entry points: the probe (a GPU and lpx-cuda.so are needed),
 * init (finds lpx-cuda's streams, registers the "nccl" comm backend), the
 * comm-creating extras of lpx_nccl.h, and the backend's run: which ranks
 * this process hosts and how they agree on an NCCL unique id (a file, the
 * environment, or lpx-mpi.so). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "nccl_internal.h"

lpx_cuda_stream_fn nc_cuda_stream;
lpx_cuda_device_count_fn nc_cuda_device_count;

/* ---- unique ids ------------------------------------------------------ */

static lpx_status new_id(ncclUniqueId *id)
{
    ncclResult_t rc = ncclGetUniqueId(id);
    if (rc != ncclSuccess) {
        char d[NC_MSG];
        nc_describe(d, sizeof d, "ncclGetUniqueId", rc, NULL);
        return lpx_error(LPX_ECOMM, "lpx-nccl: %s", d);
    }
    return LPX_OK;
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_get_unique_id(unsigned char *id)
{
    if (!id) return lpx_error(LPX_EINVAL, "lpx_nccl_get_unique_id: id is NULL");
    ncclUniqueId u;
    lpx_status st = new_id(&u);
    if (!st) memcpy(id, u.internal, NCCL_UNIQUE_ID_BYTES);
    return st;
}

static void to_hex(const ncclUniqueId *id, char *out /* 2 * 128 + 1 */)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)id->internal;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * NCCL_UNIQUE_ID_BYTES] = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* 256 hex digits, then optional white space. */
static bool from_hex(const char *s, ncclUniqueId *id)
{
    unsigned char *p = (unsigned char *)id->internal;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        int hi = hexval(s[2 * i]), lo = hi < 0 ? -1 : hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        p[i] = (unsigned char)(hi << 4 | lo);
    }
    for (s += 2 * NCCL_UNIQUE_ID_BYTES; *s; s++)
        if (*s != '\n' && *s != '\r' && *s != ' ' && *s != '\t') return false;
    return true;
}

/* Rank 0: writes the id to `path` atomically (a temporary file in the same
 * directory, fsync, rename), so a reader sees nothing or all of it. */
static lpx_status write_id_file(const char *path, const ncclUniqueId *id)
{
    char tmp[PATH_MAX], hex[2 * NCCL_UNIQUE_ID_BYTES + 2];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return lpx_error(LPX_EINVAL, "lpx-nccl: LPX_NCCL_ID_FILE=%s is too long", path);
    to_hex(id, hex);
    strcat(hex, "\n");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return lpx_error(LPX_EIO, "lpx-nccl: cannot create %s: %s", tmp, strerror(errno));
    size_t len = strlen(hex), done = 0;
    while (done < len) {
        ssize_t w = write(fd, hex + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = errno;
            close(fd);
            unlink(tmp);
            return lpx_error(LPX_EIO, "lpx-nccl: writing %s: %s", tmp, strerror(err));
        }
        done += (size_t)w;
    }
    if (fsync(fd) || close(fd)) {
        int err = errno;
        unlink(tmp);
        return lpx_error(LPX_EIO, "lpx-nccl: syncing %s: %s", tmp, strerror(err));
    }
    if (rename(tmp, path)) {
        int err = errno;
        unlink(tmp);
        return lpx_error(LPX_EIO, "lpx-nccl: renaming %s to %s: %s", tmp, path, strerror(err));
    }
    /* make the rename itself durable (shared file systems): best effort */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return LPX_OK;
}

/* Other ranks: poll for the file until the deadline. */
static lpx_status read_id_file(const char *path, int rank, int64_t timeout_ms, ncclUniqueId *id)
{
    uint64_t deadline = lpx_now_ns() + (uint64_t)timeout_ms * UINT64_C(1000000);
    long nap_ms = 1;
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char buf[2 * NCCL_UNIQUE_ID_BYTES + 64];
            size_t got = 0;
            ssize_t n;
            while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) != 0) {
                if (n < 0 && errno == EINTR) continue;
                if (n < 0) break;
                got += (size_t)n;
            }
            close(fd);
            buf[got] = 0;
            if (!from_hex(buf, id))
                return lpx_error(LPX_EINVAL, "lpx-nccl: %s (LPX_NCCL_ID_FILE) holds no NCCL id (%d hex digits)",
                                 path, 2 * NCCL_UNIQUE_ID_BYTES);
            return LPX_OK;
        }
        if (errno != ENOENT)
            return lpx_error(LPX_EIO, "lpx-nccl: cannot open %s (LPX_NCCL_ID_FILE): %s", path, strerror(errno));
        if (lpx_now_ns() >= deadline)
            return lpx_error(LPX_ETIMEOUT, "lpx-nccl: rank %d waited %" PRId64 " ms for rank 0 to write the NCCL "
                             "id to %s (LPX_NCCL_ID_FILE)", rank, timeout_ms, path);
        struct timespec ts = {0, nap_ms * 1000000L};
        nanosleep(&ts, NULL);
        if (nap_ms < 50) nap_ms *= 2;
    }
}

/* Broadcasts rank 0's id over an lpx-mpi.so comm (MPI_COMM_WORLD). */
typedef lpx_status (*mpi_comm_create_fn)(const void *mpi_comm, lpx_comm **out);

static lpx_status id_over_mpi(const lpx_plugin *mpi, int rank, int size, int64_t timeout_ms, ncclUniqueId *id)
{
    void *sym = lpx_plugin_symbol(mpi, "lpx_mpi_comm_create");
    mpi_comm_create_fn create;
    if (!sym) return lpx_error(LPX_EPLUGIN, "lpx-nccl: lpx-mpi.so exports no lpx_mpi_comm_create");
    memcpy(&create, &sym, sizeof sym);
    lpx_comm *mc = NULL;
    lpx_status st = create(NULL, &mc);
    if (st) return nc_wrap(st, "lpx-nccl: sharing the NCCL id over MPI");
    if (lpx_comm_rank(mc) != rank || lpx_comm_size(mc) != size) {
        st = lpx_error(LPX_EINVAL, "lpx-nccl: the environment says rank %d of %d but MPI_COMM_WORLD says %d of %d",
                       rank, size, lpx_comm_rank(mc), lpx_comm_size(mc));
        lpx_comm_abort(mc, "mismatched rank or world size");
        lpx_comm_destroy(mc);
        return st;
    }
    lpx_comm_set_timeout(mc, timeout_ms);
    memset(id, 0, sizeof *id);
    if (rank == 0 && (st = new_id(id))) {
        char msg[NC_MSG];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        lpx_comm_abort(mc, msg);
        lpx_comm_destroy(mc);
        return lpx_error(st, "%s", msg);
    }
    st = lpx_comm_broadcast_buf(mc, id, sizeof *id, 0);
    if (st) {
        char msg[NC_MSG];
        snprintf(msg, sizeof msg, "%s", lpx_last_error());
        lpx_comm_destroy(mc);
        return lpx_error(st, "lpx-nccl: sharing the NCCL id over MPI: %s", msg);
    }
    lpx_comm_destroy(mc);
    return LPX_OK;
}

/* The id of a multi-process world: LPX_NCCL_ID (hex), else
 * LPX_NCCL_ID_FILE, else lpx-mpi.so if loaded; a world of one makes its
 * own. *unlink_path is set when rank 0 wrote a file to remove once every
 * rank has joined. */
static lpx_status world_id(int rank, int size, int64_t timeout_ms, ncclUniqueId *id, const char **unlink_path)
{
    *unlink_path = NULL;
    const char *hex = getenv("LPX_NCCL_ID");
    if (hex && *hex) {
        if (!from_hex(hex, id))
            return lpx_error(LPX_EINVAL, "lpx-nccl: LPX_NCCL_ID is not an NCCL id (%d hex digits)",
                             2 * NCCL_UNIQUE_ID_BYTES);
        return LPX_OK;
    }
    const char *path = getenv("LPX_NCCL_ID_FILE");
    if (path && *path) {
        if (rank != 0) return read_id_file(path, rank, timeout_ms, id);
        /* a file left by an earlier job must not be read: remove it first */
        if (unlink(path) && errno != ENOENT)
            return lpx_error(LPX_EIO, "lpx-nccl: cannot remove the old %s: %s", path, strerror(errno));
        lpx_status st = new_id(id);
        if (!st) st = write_id_file(path, id);
        if (!st) *unlink_path = path;
        return st;
    }
    const lpx_plugin *mpi = NULL;
    if (size > 1 && lpx_plugin_find("mpi", &mpi) == LPX_OK) return id_over_mpi(mpi, rank, size, timeout_ms, id);
    lpx_clear_error();
    if (size == 1) return new_id(id);
    return lpx_error(LPX_EINVAL, "lpx-nccl: rank %d of %d has no way to get the NCCL id: set LPX_NCCL_ID_FILE "
                     "(a path every rank sees), LPX_NCCL_ID (hex from lpx_nccl_get_unique_id), or load "
                     "lpx-mpi.so", rank, size);
}

/* ---- comm-creating extras -------------------------------------------- */

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_comm_create(int rank, int size, const unsigned char *id, int device,
                                                  int64_t timeout_ms, lpx_comm **out)
{
    if (!out || !id) return lpx_error(LPX_EINVAL, "lpx_nccl_comm_create: %s is NULL", out ? "id" : "out");
    *out = NULL;
    ncclUniqueId u;
    memcpy(u.internal, id, NCCL_UNIQUE_ID_BYTES);
    return nc_create(1, &rank, &device, size, &u, timeout_ms, out);
}

LPX_PLUGIN_EXPORT lpx_status lpx_nccl_comm_create_local(int n, const int *devices, int64_t timeout_ms,
                                                        lpx_comm **comms)
{
    if (!comms) return lpx_error(LPX_EINVAL, "lpx_nccl_comm_create_local: comms is NULL");
    int ndev = nc_cuda_device_count();
    if (n < 1 || n > ndev)
        return lpx_error(LPX_EINVAL, "lpx_nccl_comm_create_local: %d ranks need %d GPUs and this process has %d "
                         "(NCCL runs one rank per GPU)", n, n, ndev);
    int *ranks = malloc((size_t)n * sizeof *ranks), *devs = malloc((size_t)n * sizeof *devs);
    lpx_status st = LPX_OK;
    if (!ranks || !devs) st = lpx_error(LPX_ENOMEM, "lpx_nccl_comm_create_local: out of memory");
    for (int i = 0; i < n && !st; i++) {
        ranks[i] = i;
        devs[i] = devices ? devices[i] : i;
    }
    ncclUniqueId id;
    if (!st) st = new_id(&id);
    if (!st) st = nc_create(n, ranks, devs, n, &id, timeout_ms, comms);
    free(ranks);
    free(devs);
    return st;
}

/* ---- the "nccl" backend of lpx_comm_run ------------------------------ */

/* A non-negative integer from the first of two environment variables set;
 * -1 when neither is; -2 when the value is not a number. */
static int env_rank(const char *a, const char *b, const char **which)
{
    const char *names[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        const char *s = names[i] ? getenv(names[i]) : NULL;
        if (!s || !*s) continue;
        *which = names[i];
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        return (*end || errno || v < 0 || v > INT_MAX) ? -2 : (int)v;
    }
    return -1;
}

static lpx_status nccl_run(const lpx_comm_backend_i *self, int nranks, int64_t timeout_ms, lpx_comm_rank_fn fn,
                           void *ctx, lpx_status *statuses)
{
    (void)self;
    if (!fn) return lpx_error(LPX_EINVAL, "nccl backend: fn is NULL");
    if (nranks < 0) return lpx_error(LPX_EINVAL, "nccl backend: %d ranks", nranks);
    const char *rn = "LPX_RANK", *sn = "LPX_WORLD_SIZE", *ln = NULL;
    int size = env_rank("LPX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", &sn);
    int rank = env_rank("LPX_RANK", "OMPI_COMM_WORLD_RANK", &rn);
    if (size == -1 && rank == -1) {
        /* one process hosts every rank: one thread per GPU */
        int n = nranks ? nranks : 1, ndev = nc_cuda_device_count();
        if (n > ndev)
            return lpx_error(LPX_EINVAL, "nccl backend: %d ranks in one process need %d GPUs, this one has %d "
                             "(NCCL runs one rank per GPU; launch one process per GPU with LPX_RANK/"
                             "LPX_WORLD_SIZE, or use the 'local' backend)", n, n, ndev);
        return nc_run_local(n, timeout_ms, fn, ctx, statuses);
    }
    if (size == -2 || size == 0 || size == -1)
        return lpx_error(LPX_EINVAL, "nccl backend: %s must be a positive integer (with %s)", sn, rn);
    if (rank < 0 || rank >= size)
        return lpx_error(LPX_EINVAL, "nccl backend: %s must be a rank of 0..%d", rn, size - 1);
    if (nranks != 0 && nranks != size)
        return lpx_error(LPX_EINVAL, "nccl backend: %d ranks requested but %s says the world has %d "
                         "(ask for 0 or %d)", nranks, sn, size, size);
    int ndev = nc_cuda_device_count();
    int local = env_rank("LPX_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", &ln);
    if (local == -2) return lpx_error(LPX_EINVAL, "nccl backend: %s is not a number", ln);
    int dev = local >= 0 ? local : rank % ndev;
    if (dev >= ndev)
        return lpx_error(LPX_EDEVICE, "nccl backend: rank %d wants cuda:%d (%s) but this process sees %d GPU%s",
                         rank, dev, ln, ndev, ndev == 1 ? "" : "s");
    if (timeout_ms <= 0) timeout_ms = nc_default_timeout_ms();
    ncclUniqueId id;
    const char *unlink_path = NULL;
    lpx_status st = world_id(rank, size, timeout_ms, &id, &unlink_path);
    if (st) return st;
    lpx_comm *c = NULL;
    st = nc_create(1, &rank, &dev, size, &id, timeout_ms, &c);
    /* every rank has joined (or failed): nobody reads the file any more */
    if (unlink_path) unlink(unlink_path);
    if (st) return nc_wrap(st, "nccl backend");
    char msg[NC_MSG];
    st = nc_run_rank(c, fn, ctx, msg, sizeof msg);
    if (statuses) statuses[rank] = st;
    return st ? lpx_error(st, "nccl backend: rank %d: %s", rank, msg) : LPX_OK;
}

/* ---- plugin entry points ---------------------------------------------- */

LPX_PLUGIN_EXPORT int lpx_plugin_probe(const lpx_host *host, char *reason, size_t len)
{
    (void)host;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(reason, len, "no usable CUDA driver or device (cudaGetDeviceCount: %s)", cudaGetErrorName(e));
        (void)cudaGetLastError();
        return 1;
    }
    if (n == 0) {
        snprintf(reason, len, "no CUDA device");
        return 1;
    }
    const lpx_plugin *cu = NULL;
    if (lpx_plugin_find("cuda", &cu) != LPX_OK || !lpx_plugin_symbol(cu, LPX_CUDA_SYM_STREAM) ||
        !lpx_plugin_symbol(cu, LPX_CUDA_SYM_DEVICE_COUNT)) {
        lpx_clear_error();
        snprintf(reason, len, "lpx-cuda.so is not loaded (load it before lpx-nccl.so: the comm's buffers are "
                 "its tensors and collectives are ordered against its streams)");
        return 1;
    }
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) {
        snprintf(reason, len, "the NCCL library does not answer ncclGetVersion");
        return 1;
    }
    return 0;
}

LPX_PLUGIN_EXPORT lpx_status lpx_plugin_init(const lpx_host *host, lpx_plugin_info *info)
{
    info->struct_size = sizeof *info;
    info->abi_major = LPX_PLUGIN_ABI_MAJOR;
    info->abi_minor = LPX_PLUGIN_ABI_MINOR;
    info->name = "nccl";
    info->version = "0.1.0";
    info->description = "collectives over NCCL on lpx-cuda's devices: comm backend 'nccl'";
    if (host->abi_major != LPX_PLUGIN_ABI_MAJOR)
        return lpx_error(LPX_EABI, "nccl: host speaks plugin ABI %u, built for %u", host->abi_major,
                         LPX_PLUGIN_ABI_MAJOR);
    const lpx_plugin *cu = NULL;
    if (lpx_plugin_find("cuda", &cu))
        return lpx_error(LPX_EPLUGIN, "nccl: lpx-cuda.so is not loaded (load it first)");
    void *s1 = lpx_plugin_symbol(cu, LPX_CUDA_SYM_STREAM), *s2 = lpx_plugin_symbol(cu, LPX_CUDA_SYM_DEVICE_COUNT);
    if (!s1 || !s2) return lpx_error(LPX_EPLUGIN, "nccl: lpx-cuda.so exports no %s", s1 ? LPX_CUDA_SYM_DEVICE_COUNT
                                                                                        : LPX_CUDA_SYM_STREAM);
    memcpy(&nc_cuda_stream, &s1, sizeof s1);
    memcpy(&nc_cuda_device_count, &s2, sizeof s2);
    if (nc_cuda_device_count() < 1) return lpx_error(LPX_EPLUGIN, "nccl: lpx-cuda.so serves no device");
    /* ABI 1.0's host table has no comm slot: register through the public
     * registry, as the last step (nothing to roll back if it fails) */
    static const lpx_comm_backend_i backend = {
        .struct_size = sizeof(lpx_comm_backend_i),
        .name = "nccl",
        .description = "one rank per GPU: threads of this process, or processes (LPX_RANK/LPX_WORLD_SIZE); "
                       "lpx-nccl.so",
        .run = nccl_run,
    };
    return lpx_comm_backend_register(&backend);
}
