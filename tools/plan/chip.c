/* Chip files of `lpx plan` (plan.h: pl_chip_load): JSON, every number
 * {"value": x, "source": "..."}, so a reader can check each one. */
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

/* a {"value", "source"} number in [lo, hi]; false if absent or out of range */
static bool number(const cJSON *root, const char *key, double lo, double hi, double *out)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "value"), *s = cJSON_GetObjectItemCaseSensitive(e, "source");
    if (!cJSON_IsNumber(v) || !cJSON_IsString(s) || !s->valuestring[0] || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return false;
    *out = v->valuedouble;
    return true;
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
    int rc = 0;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(out->name, sizeof out->name, "%s", cJSON_IsString(nm) ? nm->valuestring : name);
    snprintf(out->source, sizeof out->source, "%s", path);
    double sms = 0, mem = 0, bf = 0, f8 = 0, at = 0, cp = 0, pk = 0;
    if (!number(root, "sms", 1, 100000, &sms) || !number(root, "memory_gib", 0.1, 1e6, &mem) ||
        !number(root, "bf16_tflops", 1e-3, 1e6, &bf) || !number(root, "fp8_tflops", 1e-3, 1e6, &f8) ||
        !number(root, "copy_gbs", 1e-3, 1e7, &cp) || !number(root, "bf16_peak_tflops", 1e-3, 1e6, &pk))
        rc = bad(path, "needs sms, memory_gib, bf16_tflops, fp8_tflops, copy_gbs and bf16_peak_tflops, each "
                       "{\"value\": a positive number, \"source\": \"where it comes from\"}");
    if (!number(root, "attention_tflops", 1e-3, 1e6, &at)) at = 0;
    out->sms = (int)sms;
    out->memory = mem * 1073741824.0;
    out->bf16_flops = bf * 1e12;
    out->fp8_flops = f8 * 1e12;
    out->attn_flops = at * 1e12;
    out->hbm_bw = cp * 1e9;
    out->bf16_peak = pk * 1e12;
    cJSON_Delete(root);
    return rc;
}
