/* `lpx bench ckpt [--json] [--mb N] [--ranks R] [--dir D]`: sharded
 * checkpoints (docs/CHECKPOINT.md) against the disk they are written to,
 * measured in one run: the disk's sequential write (write + fsync of one
 * file of the checkpoint's size from one 8 MiB buffer, as `dd conv=fsync`
 * does; and from the model's own memory) and read of it,
 * then lpx_fsdp_save, lpx_fsdp_load at the same world size (checksums
 * verified, and with LPX_FSDP_CKPT_NO_VERIFY), lpx_fsdp_load at R - 1
 * ranks (resharding) and lpx_fsdp_export (one consolidated file, every
 * rank writing its rows) of a model of N MB of f32 weights over R local
 * ranks, each with AdamW moments (the state of a trained model). The
 * first load rows read from the page cache on both sides (the files were
 * just written): lpx's copying against a plain read. The "from disk" rows
 * drop the files' cached pages first (posix_fadvise DONTNEED on each file:
 * no root, nothing else's cache touched), so the load and the probe's read
 * both come from the device. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "lpx/lpx.h"
#include "lpx/checkpoint.h"
#include "bench_report.h"
#include "commands.h"

#define NPARAM 8
#define COLS 4096

typedef struct ck_bench {
    lpx_tensor *w[NPARAM];
    const char *dir;
    bool save, export_;
    unsigned flags;      /* load flags */
    const char *export_path;
    double ms;   /* rank 0: the call's wall time */
} ck_bench;

static lpx_status bench_rank(lpx_comm *comm, void *vctx)
{
    ck_bench *c = vctx;
    lpx_mesh *mesh = NULL;
    lpx_fsdp *f = NULL;
    lpx_fsdp_group *g = NULL;
    lpx_status st = lpx_mesh_new(comm, &mesh);
    if (!st) st = lpx_fsdp_new(mesh, NULL, &f);
    lpx_mesh_release(mesh);
    if (!st) st = lpx_fsdp_group_add(f, "model", &g);
    for (int i = 0; i < NPARAM && !st; i++) st = lpx_fsdp_param_add(g, "w", c->w[i], 0, NULL);
    if (!st) st = lpx_fsdp_shard(f);
    /* a trained model's state: AdamW moments beside every weight */
    for (int i = 0; i < NPARAM && !st; i++) {
        int64_t n = lpx_tensor_numel(lpx_fsdp_param_local(g, i));
        lpx_tensor *m = NULL, *v = NULL;
        if (!(st = lpx_full(1, &n, 0.001, LPX_F32, lpx_cpu(), &m)) && !(st = lpx_full(1, &n, 1e-6, LPX_F32, lpx_cpu(), &v)))
            st = lpx_fsdp_param_set_adamw_state(g, i, m, v, 1);
        lpx_tensor_release(m);
        lpx_tensor_release(v);
    }
    if (!st) st = lpx_comm_barrier(comm);
    uint64_t t0 = lpx_now_ns();
    lpx_fsdp_ckpt_opts o = {.struct_size = sizeof o, .flags = c->flags};
    if (!st) st = c->export_ ? lpx_fsdp_export(f, c->export_path, LPX_F32, NULL, NULL, 0, NULL)
                  : c->save  ? lpx_fsdp_save(f, c->dir)
                             : lpx_fsdp_load_ex(f, c->dir, &o);
    if (!st) st = lpx_comm_barrier(comm);
    if (!st && lpx_comm_rank(comm) == 0) c->ms = (double)(lpx_now_ns() - t0) / 1e6;
    lpx_fsdp_free(f);
    return st;
}

/* Writes (and fsyncs) or reads `bytes` of a file; returns ms, < 0 on error. */
static double disk_io(const char *path, size_t bytes, bool write_it)
{
    size_t chunk = (size_t)8 << 20;
    char *buf = malloc(chunk);
    if (!buf) return -1;
    memset(buf, 0x5A, chunk);
    int fd = write_it ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open(path, O_RDONLY);
    if (fd < 0) {
        free(buf);
        return -1;
    }
    uint64_t t0 = lpx_now_ns();
    double ms = -1;
    size_t done = 0;
    while (done < bytes) {
        size_t n = bytes - done < chunk ? bytes - done : chunk;
        ssize_t r = write_it ? write(fd, buf, n) : read(fd, buf, n);
        if (r <= 0) break;
        done += (size_t)r;
    }
    if (done == bytes && (!write_it || fsync(fd) == 0)) ms = (double)(lpx_now_ns() - t0) / 1e6;
    close(fd);
    free(buf);
    return ms;
}

/* The same write + fsync with the data taken from memory the size of the
 * model (the weights, cycled), not one cache-hot buffer: what writing a
 * model from memory can reach. ms, < 0 on error. */
static double disk_write_model(const char *path, size_t bytes, lpx_tensor *const *w, int nw)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    uint64_t t0 = lpx_now_ns();
    size_t done = 0, chunk = (size_t)8 << 20;
    int k = 0;
    size_t at = 0;
    while (done < bytes) {
        size_t have = (size_t)lpx_tensor_numel(w[k]) * 4 - at, n = bytes - done;
        n = n < chunk ? n : chunk;
        n = n < have ? n : have;
        ssize_t r = write(fd, (const char *)lpx_tensor_data(w[k]) + at, n);
        if (r <= 0) break;
        done += (size_t)r;
        at += (size_t)r;
        if (at == (size_t)lpx_tensor_numel(w[k]) * 4) {
            at = 0;
            k = (k + 1) % nw;
        }
    }
    double ms = done == bytes && fsync(fd) == 0 ? (double)(lpx_now_ns() - t0) / 1e6 : -1;
    close(fd);
    return ms;
}

/* Drops the page cache of `path` (a file, or every file of a directory):
 * their pages are clean after the fsync, so the next read goes to the
 * device. */
static void drop_cache(const char *path)
{
    struct stat sb;
    if (stat(path, &sb)) return;
    if (S_ISREG(sb.st_mode)) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        return;
    }
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        if (de->d_name[0] != '.' && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) drop_cache(p);
    }
    if (d) closedir(d);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: lpx bench ckpt [--json] [--mb N] [--ranks R] [--dir D]\n"
               "  lpx_fsdp_save / lpx_fsdp_load of N MB of f32 weights (default 256) over R local ranks\n"
               "  (default 4), loaded again on R and on R - 1 ranks, beside the disk's write+fsync and read\n"
               "  of a file of the same size; D: where (default: a new directory under $TMPDIR or /tmp)\n");
}

int lpx_bench_ckpt(int argc, char **argv)
{
    bool json = false;
    long mb = 256, ranks = 4;
    const char *where = NULL;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) {
            mb = strtol(argv[++i], &end, 10);
            if (*end || mb < 8 || mb > 65536) {
                fprintf(stderr, "lpx bench ckpt: --mb needs 8..65536\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            ranks = strtol(argv[++i], &end, 10);
            if (*end || ranks < 2 || ranks > 64) {
                fprintf(stderr, "lpx bench ckpt: --ranks needs 2..64\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            where = argv[++i];
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "lpx bench ckpt: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    char base[512], dir[600], probe[600];
    const char *tmp = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/lpx-bench-ckpt-XXXXXX", where ? where : tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        fprintf(stderr, "lpx bench ckpt: mkdtemp %s: %s\n", base, strerror(errno));
        return 1;
    }
    snprintf(dir, sizeof dir, "%s/ckpt", base);
    snprintf(probe, sizeof probe, "%s/probe.bin", base);
    int64_t rows = (int64_t)mb * (1 << 20) / (int64_t)(NPARAM * COLS * 4);
    size_t bytes = (size_t)rows * COLS * 4 * NPARAM;
    ck_bench c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    int rc = 0;
    for (int i = 0; i < NPARAM; i++) {
        int64_t s[2] = {rows, COLS};
        if (lpx_randn(2, s, 100 + (uint64_t)i, LPX_F32, lpx_cpu(), &c.w[i])) {
            fprintf(stderr, "lpx bench ckpt: %s\n", lpx_last_error());
            rc = 1;
            goto out;
        }
    }
    /* three rounds, medians: disk write, save, disk read, load, reshard
     * load, load without checksums, export */
    char exported[700];
    snprintf(exported, sizeof exported, "%s/model.safetensors", base);
    c.export_path = exported;
    double t[11][3];
    /* an untimed save first: the checkpoint's own bytes (weights, AdamW's
     * two moments, headers, index), what a save writes and a load reads,
     * and what the disk probe writes and reads, so both move the same
     * amount through the page cache */
    c.save = true;
    if (lpx_comm_run("local", (int)ranks, 0, bench_rank, &c, NULL)) {
        fprintf(stderr, "lpx bench ckpt: %s\n", lpx_last_error());
        rc = 1;
        goto out;
    }
    double ck_bytes = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[1200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) ck_bytes += (double)sb.st_size;
    }
    if (d) closedir(d);
    size_t probe_bytes = (size_t)ck_bytes;
    for (int k = 0; k < 3; k++) {
        t[7][k] = disk_write_model(probe, probe_bytes, c.w, NPARAM);
        t[0][k] = disk_io(probe, probe_bytes, true);
        c.save = true;
        lpx_status st = lpx_comm_run("local", (int)ranks, 0, bench_rank, &c, NULL);
        t[1][k] = c.ms;
        t[2][k] = disk_io(probe, probe_bytes, false);
        c.save = false;
        if (!st) st = lpx_comm_run("local", (int)ranks, 0, bench_rank, &c, NULL);
        t[3][k] = c.ms;
        if (!st) st = lpx_comm_run("local", (int)ranks - 1, 0, bench_rank, &c, NULL);
        t[4][k] = c.ms;
        c.flags = LPX_FSDP_CKPT_NO_VERIFY;
        if (!st) st = lpx_comm_run("local", (int)ranks, 0, bench_rank, &c, NULL);
        t[5][k] = c.ms;
        c.flags = 0;
        /* from the device: the probe's read and the loads after dropping
         * the files' cached pages */
        drop_cache(probe);
        t[8][k] = disk_io(probe, probe_bytes, false);
        drop_cache(dir);
        if (!st) st = lpx_comm_run("local", (int)ranks, 0, bench_rank, &c, NULL);
        t[9][k] = c.ms;
        drop_cache(dir);
        if (!st) st = lpx_comm_run("local", (int)ranks - 1, 0, bench_rank, &c, NULL);
        t[10][k] = c.ms;
        c.export_ = true;
        if (!st) st = lpx_comm_run("local", (int)ranks, 0, bench_rank, &c, NULL);
        t[6][k] = c.ms;
        c.export_ = false;
        if (st || t[0][k] < 0 || t[2][k] < 0 || t[7][k] < 0 || t[8][k] < 0) {
            fprintf(stderr, "lpx bench ckpt: %s\n", st ? lpx_last_error() : "disk probe failed");
            rc = 1;
            goto out;
        }
    }
    for (int i = 0; i < 11; i++) qsort(t[i], 3, sizeof(double), cmp_d);
    double gb = (double)bytes / 1e9, cgb = ck_bytes / 1e9, w = cgb / (t[0][1] / 1e3), s = cgb / (t[1][1] / 1e3),
           r = cgb / (t[2][1] / 1e3), l = cgb / (t[3][1] / 1e3), lr = cgb / (t[4][1] / 1e3), lnv = cgb / (t[5][1] / 1e3),
           ex = gb / (t[6][1] / 1e3), wm = cgb / (t[7][1] / 1e3), rc_ = cgb / (t[8][1] / 1e3),
           lc = cgb / (t[9][1] / 1e3), lrc = cgb / (t[10][1] / 1e3);
    lpx_bench_report rep;
    lpx_bench_report_init(&rep, "ckpt", json);
    lpx_bench_report_note(&rep, "%.0f MB of f32 weights (%d x [%lld, %d]) over %ld local ranks, in %s; the checkpoint "
                          "(weights + AdamW m, v) %.0f MB: save and load rates, and the disk probe, are over those bytes; median of 3",
                          (double)bytes / 1e6, NPARAM, (long long)rows, COLS, ranks, base, ck_bytes / 1e6);
    char note[160];
    snprintf(note, sizeof note, "all ranks; %.1f MB/s per rank", s * 1e3 / (double)ranks);
    lpx_bench_row r1 = {.case_name = "save (write+fsync, index, commit)", .value = s, .unit = "GB/s", .baseline = w,
                        .baseline_case = "disk write+fsync", .compare = wm, .compare_case = "write from model memory",
                        .goal = lpx_bench_na(), .note = note};
    lpx_bench_report_add(&rep, &r1);
    char note2[200];
    snprintf(note2, sizeof note2, "%.1f MB/s per rank; checksums verified (one read of each file), mapped views "
             "copied into the shards", l * 1e3 / (double)ranks);
    lpx_bench_row r2 = {.case_name = "load, same world", .value = l, .unit = "GB/s", .baseline = r,
                        .baseline_case = "disk read (page cache)", .compare = lpx_bench_na(), .goal = lpx_bench_na(),
                        .note = note2};
    lpx_bench_report_add(&rep, &r2);
    lpx_bench_row r2b = {.case_name = "load, same world, sizes only", .value = lnv, .unit = "GB/s", .baseline = r,
                         .baseline_case = "disk read (page cache)", .compare = lpx_bench_na(), .goal = lpx_bench_na(),
                         .note = "LPX_FSDP_CKPT_NO_VERIFY"};
    lpx_bench_report_add(&rep, &r2b);
    snprintf(note, sizeof note, "%ld ranks reading %ld ranks' files: %.2fx the same-world load's time", ranks - 1,
             ranks, t[4][1] / t[3][1]);
    lpx_bench_row r3 = {.case_name = "load, resharded", .value = lr, .unit = "GB/s", .baseline = l,
                        .baseline_case = "same-world load", .compare = lpx_bench_na(), .goal = lpx_bench_na(),
                        .note = note};
    lpx_bench_report_add(&rep, &r3);
    char note5[200];
    snprintf(note5, sizeof note5, "%.1f MB/s per rank; the files' cached pages dropped first (posix_fadvise); "
             "checksums verified", lc * 1e3 / (double)ranks);
    lpx_bench_row r5 = {.case_name = "load, same world, from disk", .value = lc, .unit = "GB/s", .baseline = rc_,
                        .baseline_case = "disk read (cold)", .compare = lpx_bench_na(), .goal = lpx_bench_na(),
                        .note = note5};
    lpx_bench_report_add(&rep, &r5);
    snprintf(note, sizeof note, "%ld ranks reading %ld ranks' files from disk: %.2fx the same-world load's time",
             ranks - 1, ranks, t[10][1] / t[9][1]);
    lpx_bench_row r6 = {.case_name = "load, resharded, from disk", .value = lrc, .unit = "GB/s", .baseline = lc,
                        .baseline_case = "same-world load from disk", .compare = lpx_bench_na(),
                        .goal = lpx_bench_na(), .note = note};
    lpx_bench_report_add(&rep, &r6);
    snprintf(note, sizeof note, "one file, every rank pwrite()s its rows, fsync, rename; %.2fx the disk's write+fsync",
             ex / w);
    lpx_bench_row r4 = {.case_name = "export, consolidated f32", .value = ex, .unit = "GB/s", .baseline = w,
                        .baseline_case = "disk write+fsync", .compare = wm, .compare_case = "write from model memory",
                        .goal = lpx_bench_na(),
                        .note = note};
    lpx_bench_report_add(&rep, &r4);
    lpx_bench_report_finish(&rep);
out:
    for (int i = 0; i < NPARAM; i++) lpx_tensor_release(c.w[i]);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd)) fprintf(stderr, "lpx bench ckpt: could not remove %s\n", base);
    return rc;
}
