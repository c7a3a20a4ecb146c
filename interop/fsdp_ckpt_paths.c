/* The paths a sharded-checkpoint save touches, and what it may do to
 * them (fsdp_ckpt_internal.h, docs/RELIABILITY.md "What a save promises").
 *
 * A save writes <dir>.tmp, exchanges it with <dir>, and removes what was
 * at <dir> before. Every one of those steps can destroy a user's files if
 * the path is not what the save thinks: a folder that happens to hold an
 * index.json, a symbolic link (whose target's files a remove would walk
 * into), a folder of the user's named like our temporary. So the save
 * replaces only a directory whose index names every file in it, removes
 * only names it writes itself, opens every directory with O_NOFOLLOW and
 * unlinks relative to that open directory (a link is removed as a link,
 * never followed). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "fsdp_ckpt_internal.h"

lpx_status ck_norm_dir(const char *op, const char *dir, char *buf, size_t len)
{
    if (!dir || !*dir) return lpx_error(LPX_EINVAL, "%s: dir is %s", op, dir ? "empty" : "NULL");
    size_t n = strlen(dir);
    /* "ck/", "ck/." and "ck/./" are "ck" */
    for (;;) {
        while (n > 1 && dir[n - 1] == '/') n--;
        if (n > 2 && dir[n - 1] == '.' && dir[n - 2] == '/') n -= 2;
        else break;
    }
    /* "." or ".." as the last name: the save's siblings ("..tmp") would be
     * made inside a checkpoint; the directory must be named */
    if ((n == 1 && dir[0] == '.') || (n == 2 && !strncmp(dir, "..", 2)) ||
        (n >= 2 && dir[n - 1] == '.' && dir[n - 2] == '/') ||
        (n >= 3 && !strncmp(dir + n - 3, "/..", 3)))
        return lpx_error(LPX_EINVAL, "%s: dir '%s' ends in '.' or '..'; name the directory itself", op, dir);
    if (n + 64 > len || n + 64 > CK_PATH) return lpx_error(LPX_EINVAL, "%s: dir path is too long", op);
    memcpy(buf, dir, n);
    buf[n] = 0;
    return LPX_OK;
}

/* "rank-RRRRR-of-WWWWW.safetensors" (+ ".tmp.XXXXXX"): its rank and world */
static bool rank_name(const char *n, int *rank, int *world, bool *temp)
{
    int r = -1, w = -1, used = 0;
    if (strncmp(n, "rank-", 5) || strlen(n) < 30) return false;
    for (int i = 5; i < 10; i++)
        if (n[i] < '0' || n[i] > '9') return false;
    for (int i = 14; i < 19; i++)
        if (n[i] < '0' || n[i] > '9') return false;
    if (sscanf(n, "rank-%5d-of-%5d.safetensors%n", &r, &w, &used) != 2 || used != 31) return false;
    *rank = r;
    *world = w;
    *temp = n[used] != 0;
    if (!n[used]) return true;
    /* lpx_safetensors_save's temporary: ".tmp." and mkostemp's 6 characters */
    return !strncmp(n + used, ".tmp.", 5) && strlen(n + used) == 11;
}

bool ck_own_name(const char *name, int world)
{
    if (!strcmp(name, "index.json") || !strcmp(name, "index.json.tmp")) return true;
    int r, w;
    bool temp;
    if (!rank_name(name, &r, &w, &temp)) return false;
    return world <= 0 || (!temp && w == world && r < world);
}

void ck_parent_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    char *s = strrchr(buf, '/');
    if (!s) snprintf(buf, len, ".");
    else if (s == buf) buf[1] = 0;
    else *s = 0;
}

/* The first entry of an open directory that fails the rule (into bad),
 * or "" when all pass; world > 0: a whole checkpoint of that world (its
 * files regular), 0: only names a save writes. *n: entries seen. */
static lpx_status scan_dir(const char *op, const char *dir, int world, char *bad, size_t len, int *n)
{
    bad[0] = 0;
    *n = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return lpx_error(LPX_EIO, "%s: '%s': open: %s", op, dir, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return lpx_error(LPX_EIO, "%s: '%s': opendir: %s", op, dir, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        (*n)++;
        struct stat sb;
        bool ok = ck_own_name(e->d_name, world) &&
                  (world <= 0 || (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode)));
        if (!ok && !bad[0]) snprintf(bad, len, "%s", e->d_name);
    }
    closedir(d);
    return LPX_OK;
}

/* <dir>.tmp or <dir>.old: absent, or a directory of our names only */
static lpx_status check_leftover(const char *op, const char *path, const char *what)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? LPX_OK : lpx_error(LPX_EIO, "%s: '%s': %s", op, path, strerror(errno));
    if (S_ISLNK(sb.st_mode) || !S_ISDIR(sb.st_mode))
        return lpx_error(LPX_EINVAL, "%s: '%s' (the save's %s) exists and is %s, not a folder lpx made; move it "
                         "away or choose another dir", op, path, what, S_ISLNK(sb.st_mode) ? "a symbolic link" : "a file");
    char bad[300];
    int n;
    lpx_status st = scan_dir(op, path, 0, bad, sizeof bad, &n);
    if (st) return st;
    if (bad[0])
        return lpx_error(LPX_EINVAL, "%s: '%s' (the save's %s) holds '%s', which lpx_fsdp_save did not write; move it "
                         "away or choose another dir (nothing was changed)", op, path, what, bad);
    return LPX_OK;
}

lpx_status ck_check_target(const char *op, const char *dir)
{
    char parent[CK_PATH], side[CK_PATH];
    ck_parent_of(dir, parent, sizeof parent);
    struct stat sb;
    int missing = stat(parent, &sb) != 0 ? errno : 0;
    if (missing || !S_ISDIR(sb.st_mode))
        return lpx_error(LPX_EINVAL, "%s: '%s': its folder '%s' %s", op, dir, parent,
                         missing == ENOENT ? "does not exist" : missing ? strerror(missing) : "is not a folder");
    if (access(parent, W_OK | X_OK) != 0)
        return lpx_error(LPX_EINVAL, "%s: '%s': its folder '%s' is not writable (%s)", op, dir, parent, strerror(errno));
    /* access() says yes to root on a read-only or pseudo file system: a
     * directory of our own, made and removed, proves the folder takes one */
    char probe[CK_PATH];
    if (snprintf(probe, sizeof probe, "%s/.lpx-probe-XXXXXX", parent) >= (int)sizeof probe)
        return lpx_error(LPX_EINVAL, "%s: dir path is too long", op);
    if (!mkdtemp(probe))
        return lpx_error(LPX_EINVAL, "%s: '%s': its folder '%s' cannot take a new directory (%s)", op, dir, parent,
                         strerror(errno));
    rmdir(probe);
    lpx_status st;
    if (lstat(dir, &sb) == 0) {
        if (S_ISLNK(sb.st_mode))
            return lpx_error(LPX_EINVAL, "%s: '%s' is a symbolic link; a save replaces the directory at that path, so "
                             "name the directory itself or another path (nothing was changed)", op, dir);
        if (!S_ISDIR(sb.st_mode))
            return lpx_error(LPX_EINVAL, "%s: '%s' exists and is not a directory (nothing was changed)", op, dir);
        char bad[300];
        int n;
        if ((st = scan_dir(op, dir, 0, bad, sizeof bad, &n))) return st;
        if (n) {
            /* a whole checkpoint: a valid index that names every file */
            ck_index ix;
            char why[600] = "";
            lpx_status rst = ck_read_index(op, dir, &ix);
            if (rst == LPX_ENOMEM) return rst;
            if (rst) snprintf(why, sizeof why, "%s", lpx_last_error());
            else if ((st = scan_dir(op, dir, ix.world, bad, sizeof bad, &n))) {
                ck_index_free(&ix);
                return st;
            }
            ck_index_free(&ix);
            lpx_clear_error();
            if (why[0] || bad[0])
                return lpx_error(LPX_EINVAL, "%s: '%s' exists and is not an lpx checkpoint (%s%s%s); a save replaces "
                                 "the directory, so choose another (nothing was changed)", op, dir,
                                 bad[0] ? "it holds '" : why, bad[0] ? bad : "", bad[0] ? "', which the save did not "
                                 "write" : "");
        }
    } else if (errno != ENOENT) {
        return lpx_error(LPX_EIO, "%s: '%s': %s", op, dir, strerror(errno));
    }
    if (snprintf(side, sizeof side, "%s.tmp", dir) >= (int)sizeof side ||
        snprintf(parent, sizeof parent, "%s.old", dir) >= (int)sizeof parent)
        return lpx_error(LPX_EINVAL, "%s: dir path is too long", op);
    if ((st = check_leftover(op, side, "temporary"))) return st;
    snprintf(side, sizeof side, "%s", parent);
    return check_leftover(op, side, "previous checkpoint's place");
}

lpx_status ck_remove_own_dir(const char *op, const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return LPX_OK;
        return lpx_error(LPX_EIO, "%s: '%s': %s (not removed: not a folder lpx made)", op, dir, strerror(errno));
    }
    char bad[300];
    int n;
    lpx_status st = scan_dir(op, dir, 0, bad, sizeof bad, &n);
    if (!st && bad[0])
        st = lpx_error(LPX_EINVAL, "%s: '%s' holds '%s', which lpx_fsdp_save did not write: the folder is left as it "
                       "is", op, dir, bad);
    DIR *d = st ? NULL : fdopendir(fd);
    if (!st && !d) st = lpx_error(LPX_EIO, "%s: '%s': opendir: %s", op, dir, strerror(errno));
    struct dirent *e;
    while (d && !st && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !ck_own_name(e->d_name, 0)) continue;
        if (unlinkat(fd, e->d_name, 0) && errno != ENOENT)
            st = lpx_error(LPX_EIO, "%s: '%s/%s': unlink: %s", op, dir, e->d_name, strerror(errno));
    }
    if (d) closedir(d);   /* closes fd */
    else close(fd);
    if (!st && rmdir(dir) && errno != ENOENT) st = lpx_error(LPX_EIO, "%s: '%s': rmdir: %s", op, dir, strerror(errno));
    return st;
}

int ck_flock_wait(int fd, int how, int timeout_ms)
{
    struct timespec nap = {0, 10 * 1000 * 1000};
    for (int waited = 0;; waited += 10) {
        if (flock(fd, how | LOCK_NB) == 0) return 1;
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK) return -1;
        if (waited >= timeout_ms) return 0;
        nanosleep(&nap, NULL);
    }
}
