/* lpx_output_path (include/lpx/safetensors.h): where a whole file that a
 * caller names is written, decided before anything is.
 *
 * Every writer in lpx makes a temporary next to the destination and
 * renames it over the destination. rename() replaces whatever the name
 * was: a FIFO a user pointed --logits at, a device node, a symbolic link
 * (the link is replaced by a plain file and its target never written).
 * So the name is resolved first: links followed to a regular file or to
 * nothing (then the target is created), anything else refused. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "lpx/safetensors.h"
#include "core/lpx_internal.h"
#include "fsdp_ckpt_internal.h"

static const char *kind_of(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}


lpx_status lpx_output_path(const char *op, const char *path, char *out, size_t len)
{
    if (!op) op = "lpx_output_path";
    if (!path || !*path || !out || !len)
        return lpx_error(LPX_EINVAL, "%s: %s", op, !path ? "path is NULL" : !*path ? "path is empty" : "out is NULL");
    char cur[PATH_MAX], next[PATH_MAX], dir[PATH_MAX];
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur)
        return lpx_error(LPX_ERANGE, "%s: path '%.64s...' is too long", op, path);
    struct stat sb;
    for (int hops = 0;; hops++) {
        if (lstat(cur, &sb) != 0) {
            if (errno != ENOENT) return lpx_error(LPX_EIO, "%s: '%s': %s", op, cur, strerror(errno));
            break;   /* absent: created */
        }
        if (!S_ISLNK(sb.st_mode)) break;
        if (hops == 40) return lpx_error(LPX_EINVAL, "%s: '%s': too many levels of symbolic links", op, path);
        ssize_t n = readlink(cur, next, sizeof next - 1);
        if (n < 0) return lpx_error(LPX_EINVAL, "%s: '%s': readlink: %s", op, cur, strerror(errno));
        next[n] = 0;
        if (next[0] == '/') {
            memcpy(cur, next, (size_t)n + 1);
        } else {
            /* relative to the link's own folder */
            ck_parent_of(cur, dir, sizeof dir);
            if (snprintf(cur, sizeof cur, "%s/%s", dir, next) >= (int)sizeof cur)
                return lpx_error(LPX_ERANGE, "%s: '%s': the link's target path is too long", op, path);
        }
    }
    bool present = lstat(cur, &sb) == 0;
    if (present && !S_ISREG(sb.st_mode)) {
        if (strcmp(cur, path))
            return lpx_error(LPX_EINVAL, "%s: '%s' leads to '%s', which is %s: an output must be a file (nothing was "
                             "written)", op, path, cur, kind_of(sb.st_mode));
        return lpx_error(LPX_EINVAL, "%s: '%s' is %s: an output must be a file (nothing was written)", op, path,
                         kind_of(sb.st_mode));
    }
    /* the temporary is made in the destination's folder and renamed there */
    ck_parent_of(cur, dir, sizeof dir);
    struct stat db;
    int e = stat(dir, &db) != 0 ? errno : 0;
    if (e || !S_ISDIR(db.st_mode))
        return lpx_error(LPX_EIO, "%s: '%s': its folder '%s' %s (nothing was written)", op, path, dir,
                         e == ENOENT ? "does not exist" : e ? strerror(e) : "is not a folder");
    if (access(dir, W_OK | X_OK) != 0)
        return lpx_error(LPX_EIO, "%s: '%s': its folder '%s' is not writable (%s)", op, path, dir, strerror(errno));
    /* access() says yes to root on a read-only or pseudo file system
     * (/sys, /proc/self/fd): a file of our own, made and removed, proves
     * the folder takes the temporary the write will need */
    char probe[PATH_MAX], real[PATH_MAX];
    if (snprintf(probe, sizeof probe, "%s/.lpx-probe-XXXXXX", dir) >= (int)sizeof probe)
        return lpx_error(LPX_ERANGE, "%s: '%s': the path is too long", op, path);
    int pfd = mkstemp(probe);
    if (pfd < 0)
        return lpx_error(LPX_EIO, "%s: '%s': its folder '%s' cannot take a new file (%s; nothing was written)", op,
                         path, dir, strerror(errno));
    close(pfd);
    unlink(probe);
    /* the canonical name: the folder's real path and the file's name, so
     * two spellings of one file compare equal ("a.st", "./a.st") */
    const char *base = strrchr(cur, '/');
    base = base ? base + 1 : cur;
    if (!realpath(dir, real)) snprintf(real, sizeof real, "%s", dir);
    int need = snprintf(out, len, "%s%s%s", real, strcmp(real, "/") ? "/" : "", base);
    if (need < 0 || (size_t)need >= len)
        return lpx_error(LPX_ERANGE, "%s: '%s': the resolved path does not fit out", op, path);
    return LPX_OK;
}
