/* Chip files of `lpx plan` (plan.h: pl_chip_load): JSON, every number
 * {"value": x, "source": "..."}, so a reader can check each one. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "plan.h"

static int bad(const char *path, const char *what)
{
    fprintf(stderr, "lpx plan: chip file '%s': %s\n", path, what);
    return 2;
}

/* the {"value", "source"} number `key`, finite in [lo, hi] (a whole number
 * if whole); absent and optional: *out = 0. 0, or 2 after one line naming
 * the file and the field. */
static int number(const cJSON *root, const char *path, const char *key, double lo, double hi, bool whole,
                  bool optional, double *out)
{
    char what[256];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = 0;
    if (!e && optional) return 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "value"), *s = cJSON_GetObjectItemCaseSensitive(e, "source");
    if (!cJSON_IsNumber(v) || !cJSON_IsString(s) || !s->valuestring[0]) {
        snprintf(what, sizeof what, "\"%s\" must be {\"value\": a number, \"source\": \"where it comes from\"}", key);
        return bad(path, what);
    }
    double x = v->valuedouble;
    if (!isfinite(x) || x < lo || x > hi || (whole && x != floor(x))) {
        snprintf(what, sizeof what, "\"%s\" %g: expected a%s number in %g..%g", key, x, whole ? " whole" : "", lo, hi);
        return bad(path, what);
    }
    *out = x;
    return 0;
}

int pl_chip_load(const char *name, const char *data_dir, pl_chip *out)
{
    char path[1100];
    memset(out, 0, sizeof *out);
    if (!strchr(name, '/') && !strchr(name, '.')) snprintf(path, sizeof path, "%s/%s.json", data_dir, name);
    else snprintf(path, sizeof path, "%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) return bad(path, "cannot open it (--chip h100, h200, or a file the GPU benchmark wrote)");
    char *text = malloc(1 << 20);
    size_t n = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!text) return bad(path, "out of memory");
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return bad(path, "not JSON");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(out->name, sizeof out->name, "%s", cJSON_IsString(nm) ? nm->valuestring : name);
    snprintf(out->source, sizeof out->source, "%s", path);
    double sms = 0, mem = 0, bf = 0, f8 = 0, at = 0, cp = 0, pk = 0, pk8 = 0;
    int rc = number(root, path, "sms", 1, 100000, true, false, &sms);
    if (!rc) rc = number(root, path, "memory_gib", 0.1, 1e6, false, false, &mem);
    if (!rc) rc = number(root, path, "bf16_tflops", 1e-3, 1e6, false, false, &bf);
    if (!rc) rc = number(root, path, "fp8_tflops", 1e-3, 1e6, false, false, &f8);
    if (!rc) rc = number(root, path, "copy_gbs", 1e-3, 1e7, false, false, &cp);
    if (!rc) rc = number(root, path, "bf16_peak_tflops", 1e-3, 1e6, false, false, &pk);
    if (!rc) rc = number(root, path, "attention_tflops", 1e-3, 1e6, false, true, &at);
    if (!rc) rc = number(root, path, "fp8_peak_tflops", 1e-3, 2e6, false, true, &pk8);
    if (!rc && pk8 == 0) pk8 = 2 * pk;   /* fp8 dense peak: twice bf16's (Hopper, Ada, Blackwell) */
    /* an achieved rate above its peak would put the MFU over 100% */
    char what[256];
    if (!rc && bf > pk) {
        snprintf(what, sizeof what, "\"bf16_tflops\" %g exceeds \"bf16_peak_tflops\" %g", bf, pk);
        rc = bad(path, what);
    } else if (!rc && at > pk) {
        snprintf(what, sizeof what, "\"attention_tflops\" %g exceeds \"bf16_peak_tflops\" %g", at, pk);
        rc = bad(path, what);
    } else if (!rc && f8 > pk8) {
        snprintf(what, sizeof what, "\"fp8_tflops\" %g exceeds the fp8 peak %g (\"fp8_peak_tflops\", default twice "
                 "\"bf16_peak_tflops\")", f8, pk8);
        rc = bad(path, what);
    }
    out->sms = (int)sms;
    out->memory = mem * 1073741824.0;
    out->bf16_flops = bf * 1e12;
    out->fp8_flops = f8 * 1e12;
    out->attn_flops = at * 1e12;
    out->hbm_bw = cp * 1e9;
    out->bf16_peak = pk * 1e12;
    out->fp8_peak = pk8 * 1e12;
    cJSON_Delete(root);
    return rc;
}
