/* Whole-file outputs at user-named paths (outfile.h): resolve first,
 * write beside the destination, rename. A name is never truncated in
 * place, so a crash leaves the previous file or the new one, and a FIFO
 * or device a user pointed an option at is refused before the run. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "outfile.h"

lpx_status tr_outfile_open(const char *what, const char *path, tr_outfile *o)
{
    memset(o, 0, sizeof *o);
    lpx_status st = lpx_output_path(what, path, o->final, sizeof o->final);
    if (st) return st;
    char *slash = strrchr(o->final, '/');
    int dl = slash ? (int)(slash - o->final) : 1;
    const char *dir = slash ? o->final : ".";
    snprintf(o->tmp, sizeof o->tmp, "%.*s/.%s.tmp.XXXXXX", dl, dir, slash ? slash + 1 : o->final);
    int fd = mkstemp(o->tmp);
    if (fd < 0) return lpx_error(LPX_EIO, "%s: cannot create a temporary file next to '%s': %s", what, o->final,
                                 strerror(errno));
    if (fchmod(fd, 0644) != 0 || !(o->f = fdopen(fd, "w"))) {
        int e = errno;
        close(fd);
        unlink(o->tmp);
        return lpx_error(LPX_EIO, "%s: '%s': %s", what, o->tmp, strerror(e));
    }
    return LPX_OK;
}

lpx_status tr_outfile_commit(tr_outfile *o)
{
    if (!o->f) return lpx_error(LPX_EINVAL, "tr_outfile_commit: not open");
    int bad = ferror(o->f) != 0;
    bad |= fflush(o->f) != 0;
    bad |= fsync(fileno(o->f)) != 0;
    int e = errno;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (bad || rename(o->tmp, o->final) != 0) {
        if (!bad) e = errno;
        unlink(o->tmp);
        return lpx_error(LPX_EIO, "cannot write '%s': %s", o->final, strerror(e));
    }
    return LPX_OK;
}

void tr_outfile_abort(tr_outfile *o)
{
    if (!o->f) return;
    fclose(o->f);
    o->f = NULL;
    unlink(o->tmp);
}

lpx_status tr_check_out_dir(const char *opt, const char *dir, const char *const *names, int n)
{
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return lpx_error(LPX_EINVAL, "%s '%s' is not a directory; it names the directory to write", opt, dir);
        if (access(dir, W_OK | X_OK) != 0)
            return lpx_error(LPX_EIO, "%s '%s' is not writable: %s", opt, dir, strerror(errno));
        char path[4300], res[4096], what[64];
        snprintf(what, sizeof what, "%s", opt);
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            lpx_status st = lpx_output_path(what, path, res, sizeof res);
            if (st) return st;
        }
        return LPX_OK;
    }
    if (errno != ENOENT) return lpx_error(LPX_EIO, "%s '%s': %s", opt, dir, strerror(errno));
    /* made later: its parent must take it */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *s = strrchr(parent, '/');
    if (!s) snprintf(parent, sizeof parent, ".");
    else if (s == parent) parent[1] = 0;
    else *s = 0;
    int e = stat(parent, &sb) != 0 ? errno : 0;
    if (e || !S_ISDIR(sb.st_mode))
        return lpx_error(LPX_EIO, "%s '%s': its folder '%s' %s", opt, dir, parent,
                         e == ENOENT ? "does not exist" : e ? strerror(e) : "is not a folder");
    if (access(parent, W_OK | X_OK) != 0)
        return lpx_error(LPX_EIO, "%s '%s': its folder '%s' is not writable: %s", opt, dir, parent, strerror(errno));
    return LPX_OK;
}

const char *tr_same_file_in(const char *out, const char *file, const char *dir)
{
    static char hit[4352];
    struct stat o, sb;
    if (stat(out, &o) != 0) return NULL;   /* not there: it is no input */
    if (file && stat(file, &sb) == 0 && sb.st_dev == o.st_dev && sb.st_ino == o.st_ino) return file;
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *e;
    const char *found = NULL;
    while (d && !found && (e = readdir(d))) {
        snprintf(hit, sizeof hit, "%s/%s", dir, e->d_name);
        if (stat(hit, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_dev == o.st_dev && sb.st_ino == o.st_ino) found = hit;
    }
    if (d) closedir(d);
    return found;
}

/* a folder's canonical name, whether it exists yet or not */
static void canonical_dir(const char *d, char *buf, size_t n)
{
    char rp[PATH_MAX], parent[4096];
    if (realpath(d, rp)) {
        snprintf(buf, n, "%s", rp);
        return;
    }
    snprintf(parent, sizeof parent, "%s", d);
    char *s = strrchr(parent, '/');
    const char *base = s ? s + 1 : d;
    if (!s) snprintf(parent, sizeof parent, ".");
    else if (s == parent) parent[1] = 0;
    else *s = 0;
    if (realpath(parent, rp)) snprintf(buf, n, "%s/%s", rp, base);
    else snprintf(buf, n, "%s", d);
}

lpx_status tr_check_output_clash(const char *save, const char *out, const char *save_hf, const char *init)
{
    char a[4352], b[4352];
    struct {
        const char *x, *y, *why;
    } pairs[] = {
        {save, out, "--save and --out name one directory; a checkpoint holds only its own files"},
        {save, save_hf, "--save and --save-hf name one directory; a checkpoint holds only its own files"},
        {save_hf, init, "--save-hf names the --init folder; it would replace the model being read (write the new one "
                        "elsewhere)"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        if (!pairs[i].x || !pairs[i].y) continue;
        canonical_dir(pairs[i].x, a, sizeof a);
        canonical_dir(pairs[i].y, b, sizeof b);
        if (!strcmp(a, b)) return lpx_error(LPX_EINVAL, "%s ('%s')", pairs[i].why, a);
    }
    return LPX_OK;
}
