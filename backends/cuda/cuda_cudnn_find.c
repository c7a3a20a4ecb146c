/* The cuDNN search of lpx-cuda (cuda_cudnn_find.h: the order and why). */
#include "cuda_cudnn_find.h"

#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* appends s to out unless it is there already or too long */
static size_t add(char (*out)[CU_CUDNN_PATH_MAX], size_t n, size_t max, const char *s, size_t len)
{
    if (n >= max || len == 0 || len >= CU_CUDNN_PATH_MAX) return n;
    for (size_t i = 0; i < n; i++)
        if (strlen(out[i]) == len && !memcmp(out[i], s, len)) return n;
    memcpy(out[n], s, len);
    out[n][len] = '\0';
    return n + 1;
}

/* dir + "/" + name as a candidate (one slash between) */
static size_t add_in(char (*out)[CU_CUDNN_PATH_MAX], size_t n, size_t max, const char *dir, size_t dlen,
                     const char *name)
{
    char buf[CU_CUDNN_PATH_MAX];
    while (dlen > 1 && dir[dlen - 1] == '/') dlen--;
    int k = snprintf(buf, sizeof buf, "%.*s/%s", (int)dlen, dir, name);
    if (k < 0 || (size_t)k >= sizeof buf) return n;
    return add(out, n, max, buf, (size_t)k);
}

/* the end of the last "/site-packages/" or "/dist-packages/" component
 * of p (just past its slash), or 0 */
static size_t packages_end(const char *p)
{
    static const char *const dirs[] = {"/site-packages/", "/dist-packages/"};
    size_t best = 0;
    for (size_t d = 0; d < 2; d++)
        for (const char *s = strstr(p, dirs[d]); s; s = strstr(s + 1, dirs[d])) {
            size_t end = (size_t)(s - p) + strlen(dirs[d]);
            if (end > best) best = end;
        }
    return best;
}

size_t cu_cudnn_candidates(const char *env_path, const char *const *loaded, size_t n_loaded,
                           char (*out)[CU_CUDNN_PATH_MAX], size_t max_out)
{
    size_t n = add(out, 0, max_out, CU_CUDNN_NAME, strlen(CU_CUDNN_NAME));
    for (const char *e = env_path; e && *e;) {
        const char *colon = strchr(e, ':');
        size_t len = colon ? (size_t)(colon - e) : strlen(e);
        if (len) {
            /* the entry's last component: a library file, or a folder */
            size_t b = len;
            while (b > 0 && e[b - 1] != '/') b--;
            if (len - b >= 8 && !strncmp(e + b, "libcudnn", 8)) n = add(out, n, max_out, e, len);
            else n = add_in(out, n, max_out, e, len, CU_CUDNN_NAME);
        }
        e = colon ? colon + 1 : e + len;
    }
    for (size_t i = 0; i < n_loaded; i++) {
        if (!loaded[i]) continue;
        size_t end = packages_end(loaded[i]);
        if (!end) continue;
        char dir[CU_CUDNN_PATH_MAX];
        int k = snprintf(dir, sizeof dir, "%.*snvidia/cudnn/lib", (int)end, loaded[i]);
        if (k > 0 && (size_t)k < sizeof dir) n = add_in(out, n, max_out, dir, (size_t)k, CU_CUDNN_NAME);
    }
    return n;
}

struct loaded_acc {
    char (*out)[CU_CUDNN_PATH_MAX];
    size_t n, max;
};

static int on_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct loaded_acc *a = data;
    const char *name = info->dlpi_name;
    size_t end = name ? packages_end(name) : 0;
    /* the folder itself (with its slash): torch's hundred libraries are one entry */
    if (end) a->n = add(a->out, a->n, a->max, name, end);
    return 0;
}

size_t cu_loaded_objects(char (*out)[CU_CUDNN_PATH_MAX], size_t max)
{
    struct loaded_acc a = {out, 0, max};
    dl_iterate_phdr(on_object, &a);
    return a.n;
}

/* appends "; " (when not first) and the formatted text to buf, truncating */
static void note(char *buf, size_t n, const char *fmt, const char *a, const char *b)
{
    size_t used = strlen(buf);
    if (used + 1 >= n) return;
    snprintf(buf + used, n - used, "%s", used ? "; " : "");
    used = strlen(buf);
    if (used + 1 < n) snprintf(buf + used, n - used, fmt, a, b);
}

void *cu_cudnn_open(cu_dlopen_fn open_fn, cu_dlerror_fn error_fn, int flags, const char *env_path,
                    const char *const *loaded, size_t n_loaded, char *chosen, size_t chosen_n, char *looked,
                    size_t looked_n)
{
    static char cands[CU_CUDNN_MAX_CANDIDATES][CU_CUDNN_PATH_MAX];   /* callers serialize (one lock) */
    size_t n_env = cu_cudnn_candidates(env_path, NULL, 0, cands, CU_CUDNN_MAX_CANDIDATES);
    size_t nc = cu_cudnn_candidates(env_path, loaded, n_loaded, cands, CU_CUDNN_MAX_CANDIDATES);
    char scratch[8];
    if (!looked || !looked_n) looked = scratch, looked_n = sizeof scratch;
    looked[0] = '\0';
    if (chosen && chosen_n) chosen[0] = '\0';
    for (size_t i = 0; i < nc; i++) {
        const char *c = cands[i];
        if (c[0] == '/' && access(c, F_OK) != 0) {
            note(looked, looked_n, "%s: %s", c, "absent");
        } else {
            if (error_fn) (void)error_fn();   /* clear a stale error */
            void *h = open_fn(c, flags);
            if (h) {
                if (chosen && chosen_n) snprintf(chosen, chosen_n, "%s", c);
                return h;
            }
            const char *e = error_fn ? error_fn() : NULL;
            if (e && strstr(e, c)) note(looked, looked_n, "%s%s", e, "");   /* the loader names the file */
            else note(looked, looked_n, "%s: %s", c, e ? e : "not loadable");
        }
        /* after the loader's own search: whether the variable was set */
        if (i == 0 && (!env_path || !*env_path)) note(looked, looked_n, "%s%s", "LPX_CUDNN_PATH not set", "");
    }
    if (nc == n_env)
        note(looked, looked_n, "%s%s", "no loaded library lives under a Python site-packages folder", "");
    return NULL;
}
