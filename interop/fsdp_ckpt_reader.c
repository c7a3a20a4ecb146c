/* Reading a sharded checkpoint without an engine (lpx_fsdp_ckpt_*,
 * include/lpx/checkpoint.h): its world size, the caller's user object and
 * extra tensors. A framework reads its configuration here before it
 * builds the model, and its per-rank state (recipe histories, data
 * loader) after: any rank reads any extra, whatever the world size. */
#include <stdio.h>
#include <string.h>
#include "fsdp_ckpt_internal.h"

struct lpx_fsdp_ckpt {
    ck_index ix;
    char *user;                /* the user object's text, or NULL */
    lpx_safetensors **files;   /* per saved rank, opened on first use */
    bool *verified;            /* per saved rank: its checksum was checked */
};

lpx_status lpx_fsdp_ckpt_open(const char *dir, lpx_fsdp_ckpt **out)
{
    const char *op = "lpx_fsdp_ckpt_open";
    lpx_status st = lpx_ensure_init();
    if (st) return st;
    if (!out) return lpx_error(LPX_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    lpx_fsdp_ckpt *c = lpx_calloc(1, sizeof *c);
    if (!c) return lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    if ((st = ck_read_index(op, dir, &c->ix))) {
        lpx_free(c);
        return st;
    }
    c->files = lpx_calloc((size_t)c->ix.world, sizeof *c->files);
    c->verified = lpx_calloc((size_t)c->ix.world, sizeof *c->verified);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(c->ix.root, "user");
    if (u) {
        char *text = cJSON_PrintUnformatted(u);
        c->user = text ? lpx_strdup(text) : NULL;
        cJSON_free(text);
    }
    if (!c->files || !c->verified || (u && !c->user)) {
        lpx_fsdp_ckpt_close(c);
        return lpx_error(LPX_ENOMEM, "%s: out of memory", op);
    }
    *out = c;
    return LPX_OK;
}

int lpx_fsdp_ckpt_world(const lpx_fsdp_ckpt *c) { return c ? c->ix.world : 0; }

const char *lpx_fsdp_ckpt_user(const lpx_fsdp_ckpt *c) { return c ? c->user : NULL; }

/* The saved rank that holds extra `name`, or -1. */
static int extra_rank(const lpx_fsdp_ckpt *c, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, c->ix.extras)
    {
        const cJSON *n = cJSON_GetArrayItem(e, 0), *r = cJSON_GetArrayItem(e, 1);
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name) && cJSON_IsNumber(r) && r->valuedouble >= 0 &&
            r->valuedouble < c->ix.world)
            return (int)r->valuedouble;
    }
    return -1;
}

lpx_status lpx_fsdp_ckpt_extra(lpx_fsdp_ckpt *c, const char *name, unsigned flags, lpx_tensor **out)
{
    const char *op = "lpx_fsdp_ckpt_extra";
    if (!c || !name || !out)
        return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, !c ? "c" : !name ? "name" : "out");
    *out = NULL;
    int r = extra_rank(c, name);
    if (r < 0) return lpx_error(LPX_ENOTFOUND, "%s: the checkpoint in %s has no extra tensor '%s'", op, c->ix.dir, name);
    bool verify = !(flags & LPX_FSDP_CKPT_NO_VERIFY);
    if (verify && c->files[r] && !c->verified[r]) {
        /* opened unverified before: check it now */
        lpx_safetensors_close(c->files[r]);
        c->files[r] = NULL;
    }
    ck_open o = {c->files, &c->ix, verify};
    lpx_safetensors *sf = NULL;
    lpx_status st = ck_open_rank(op, &o, r, &sf);
    if (st) return st;
    c->verified[r] |= verify;
    char key[300];
    snprintf(key, sizeof key, CK_EXTRA "%s", name);
    st = lpx_safetensors_get(sf, key, out);
    if (st) return lpx_error(st, "%s: rank %d's file in %s lacks '%s' (the index lists it)", op, r, c->ix.dir, key);
    return LPX_OK;
}

int lpx_fsdp_ckpt_param_count(const lpx_fsdp_ckpt *c) { return c ? cJSON_GetArraySize(c->ix.params) : 0; }

lpx_status lpx_fsdp_ckpt_param(const lpx_fsdp_ckpt *c, int i, lpx_fsdp_ckpt_param_info *out)
{
    const char *op = "lpx_fsdp_ckpt_param";
    if (!c || !out) return lpx_error(LPX_EINVAL, "%s: %s is NULL", op, c ? "out" : "c");
    int n = cJSON_GetArraySize(c->ix.params);
    if (i < 0 || i >= n) return lpx_error(LPX_EINVAL, "%s: index %d of %d parameters", op, i, n);
    memset(out, 0, sizeof *out);
    const cJSON *p = cJSON_GetArrayItem(c->ix.params, i);
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(p, "key"), *dt = cJSON_GetObjectItemCaseSensitive(p, "dtype"),
                *kind = cJSON_GetObjectItemCaseSensitive(p, "kind"), *shape = cJSON_GetObjectItemCaseSensitive(p, "shape"),
                *unit = cJSON_GetObjectItemCaseSensitive(p, "unit"), *fz = cJSON_GetObjectItemCaseSensitive(p, "frozen");
    bool ok = cJSON_IsString(key) && cJSON_IsString(dt) && cJSON_IsString(kind) && cJSON_IsArray(shape) &&
              cJSON_GetArraySize(shape) <= 8 && cJSON_IsNumber(unit) && cJSON_IsNumber(fz) &&
              (int)lpx_dtype_from_name(dt->valuestring) >= 0;
    if (ok) out->dtype = lpx_dtype_from_name(dt->valuestring);
    if (ok) {
        const char *s1 = strchr(key->valuestring, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
        ok = s2 != NULL;
        out->key = key->valuestring;
        out->name = s2 ? s2 + 1 : NULL;
        out->kind = kind->valuestring;
        out->unit = (int64_t)unit->valuedouble;
        out->frozen = fz->valuedouble != 0;
        out->ndim = cJSON_GetArraySize(shape);
        for (int d = 0; ok && d < out->ndim; d++) {
            const cJSON *v = cJSON_GetArrayItem(shape, d);
            ok = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 9e15;
            if (ok) out->shape[d] = (int64_t)v->valuedouble;
        }
    }
    if (!ok) {
        lpx_clear_error();
        return lpx_error(LPX_EINVAL, "%s: parameter %d of the index in %s is malformed", op, i, c->ix.dir);
    }
    return LPX_OK;
}

void lpx_fsdp_ckpt_close(lpx_fsdp_ckpt *c)
{
    if (!c) return;
    for (int r = 0; c->files && r < c->ix.world; r++) lpx_safetensors_close(c->files[r]);
    lpx_free(c->files);
    lpx_free(c->verified);
    lpx_free(c->user);
    ck_index_free(&c->ix);   /* and its lock on the directory */
    lpx_free(c);
}
