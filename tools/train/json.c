/* Reading fields of the JSON lpx train trusts only after checking: the
 * checkpoint record (ckpt.c, ckpt_v2.c) and Hugging Face's config.json
 * (hf.c). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <cjson/cJSON.h>
#include "train.h"

bool tr_json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= (double)lo && j->valuedouble <= (double)hi) ||
        j->valuedouble != floor(j->valuedouble))
        return false;
    *out = (int64_t)j->valuedouble;
    return true;
}

const char *tr_json_str(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

char *tr_hex64(uint64_t v, char *buf)
{
    snprintf(buf, 17, "%016" PRIx64, v);
    return buf;
}
