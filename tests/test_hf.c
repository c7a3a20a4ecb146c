/* Hugging Face model folders read and written by the `lpx` command (issue
 * 33, "nothing lost"): `--save-hf` over an earlier sharded model leaves
 * exactly the new model (and every file that is not a model file); a
 * tensor in two shards, or where the index does not put it, is refused; a
 * weight_map value that is not a string is refused (a use after free
 * before); a FIFO as config.json, the index or a shard is refused, not
 * waited on; config.json is read as transformers reads it or refused in one
 * line. Runs the built executable on copies of tests/data/llama_tiny/. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "check.h"
#include "run_util.h"
#include "lpx/lpx.h"

static char fixture[512], outdir[256], corpus[512], python[512];

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* s with its first `from` replaced by `to` (a new string; s itself when
 * from is not in it, which the CHECK reports) */
static char *replaced(const char *s, const char *from, const char *to)
{
    const char *p = strstr(s, from);
    CHECKF(p != NULL, "'%s' is not in the fixture's text", from);
    if (!p) return strdup(s);
    size_t a = (size_t)(p - s), nf = strlen(from), nt = strlen(to), n = strlen(s);
    char *r = malloc(n - nf + nt + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, nt);
    memcpy(r + a + nt, p + nf, n - a - nf + 1);
    return r;
}

/* `lpx ARGS` under a 60 s limit: a command that would wait forever (a
 * FIFO opened for reading) fails the test with 124 instead of hanging it */
static int run_limited(const char *args, char *buf, size_t len)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(buf, 1, len - 1, p);
    buf[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static double loss_of(const char *out)
{
    const char *s = strstr(out, "mean next-token loss ");
    return s ? atof(s + strlen("mean next-token loss ")) : NAN;
}

/* a copy of the fixture in DIR (its config.json replaced when cfg is given) */
static void copy_fixture(const char *dir, const char *cfg)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, fixture, dir);
    CHECK(system(cmd) == 0);
    if (cfg) {
        snprintf(cmd, sizeof cmd, "%s/config.json", dir);
        spit(cmd, cfg);
    }
}

/* lpx eval of DIR on the fixture's tokens: its exit code, output in out */
static int eval_dir(const char *dir, char *out, size_t n)
{
    char args[2048];
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin'", dir, fixture);
    return run_limited(args, out, n);
}

/* u16 token ids below 128 from the corpus bytes */
static void write_ids(const char *path)
{
    char *text = slurp(corpus);
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; text && f && text[i] && i < 20000; i++) {
        uint16_t id = (uint16_t)((unsigned char)text[i] % 128);
        fwrite(&id, 2, 1, f);
    }
    if (f) fclose(f);
    free(text);
}

/* the loss lpx eval gives for DIR's model.safetensors and config.json
 * alone (copied into a clean folder): what DIR should load */
static double clean_loss(const char *dir)
{
    char clean[700], cmd[4096], out[8192];
    snprintf(clean, sizeof clean, "%s/clean", outdir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir '%s' && cp '%s/model.safetensors' '%s/config.json' '%s/'", clean,
             clean, dir, dir, clean);
    CHECK(system(cmd) == 0);
    int rc = eval_dir(clean, out, sizeof out);
    CHECKF(rc == 0, "eval of the clean copy: %d %s", rc, out);
    return loss_of(out);
}

/* --save-hf twice into the folder of a sharded model (first trained for 2
 * steps, then for 4): after each save the folder loads as the new model,
 * the old index and its shards are gone, the tokenizer file and README
 * stay, and a shard that is a symbolic link is neither followed nor
 * removed. Before the fix the stale index won: every load gave the
 * original model. */
static void test_save_hf_over_sharded(void)
{
    char dir[600], ids[600], args[4096], path[900], target[900];
    static char out[65536];
    snprintf(dir, sizeof dir, "%s/over", outdir);
    snprintf(ids, sizeof ids, "%s/ids.bin", outdir);
    write_ids(ids);
    copy_fixture(dir, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    spit(path, "{\"model\": {}}\n");
    snprintf(path, sizeof path, "%s/README.md", dir);
    spit(path, "a model card\n");
    /* shard 2: a symbolic link to a copy outside the folder */
    snprintf(target, sizeof target, "%s/shard2-elsewhere.safetensors", outdir);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    CHECK(rename(path, target) == 0 && symlink(target, path) == 0);
    int rc = eval_dir(dir, out, sizeof out);
    CHECKF(rc == 0, "eval of the copy: %d %s", rc, out);
    double orig = loss_of(out);
    for (int steps = 2; steps <= 4; steps += 2) {
        snprintf(args, sizeof args, "train --init '%s' --recipe f32 --ranks 1 --micro 1 --batch 2 --steps %d --seq 16 "
                 "--lr 0.01 --eval 1 --sample 0 --data '%s' --save-hf '%s' --out '%s/ft%d'", fixture, steps, ids, dir,
                 outdir, steps);
        rc = run_limited(args, out, sizeof out);
        CHECKF(rc == 0, "train --steps %d exited %d: %s", steps, rc, out);
        rc = eval_dir(dir, out, sizeof out);
        double got = loss_of(out), want = clean_loss(dir);
        CHECKF(rc == 0 && got == want && got != orig, "after save %d: the folder loads loss %.7f, the new model %.7f, "
               "the original %.7f (%s)", steps, got, want, orig, out);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        CHECKF(!exists(path), "the stale index is still there after save %d", steps);
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
        CHECKF(!exists(path), "the stale shard 1 is still there after save %d", steps);
        struct stat sb;
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        CHECKF(lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode), "the symbolic link shard was removed");
        CHECKF(exists(target), "the link's target was removed");
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        CHECK(exists(path));
        snprintf(path, sizeof path, "%s/README.md", dir);
        CHECK(exists(path));
    }
}

/* DIR's index with `from` replaced by `to` */
static void edit_index(const char *dir, const char *from, const char *to)
{
    char path[900];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char *t = slurp(path), *e = t ? replaced(t, from, to) : NULL;
    if (e) spit(path, e);
    free(t);
    free(e);
}

/* eval and train --init both refuse DIR in one line holding `want`, exit 2 */
static void both_refuse(const char *dir, const char *want)
{
    char args[4096], out[8192];
    int rc = eval_dir(dir, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, want) && count_lines(out) == 1, "eval of %s: exit %d, want '%s': %s", dir, rc, want,
           out);
    snprintf(args, sizeof args, "train --init '%s' --steps 1 --seq 16 --out '%s/never'", dir, outdir);
    rc = run_limited(args, out, sizeof out);
    CHECKF(rc == 2 && strstr(out, want) && count_lines(out) == 1, "train of %s: exit %d, want '%s': %s", dir, rc, want,
           out);
}

/* lm_head.weight in shard 2 and (other values) in a third shard the index
 * points at: eval read the third, train --init the second. Refused, naming
 * the tensor and both files; so is an index that puts a tensor in a shard
 * that does not hold it. */
static void test_tensor_in_two_shards(void)
{
    char dir[600], path[900];
    snprintf(dir, sizeof dir, "%s/dup", outdir);
    copy_fixture(dir, NULL);
    lpx_tensor *t = NULL;
    int64_t shape[2] = {128, 64};
    CHECK_OK(lpx_zeros(2, shape, LPX_F32, lpx_cpu(), &t));
    const char *name = "lm_head.weight";
    snprintf(path, sizeof path, "%s/model-00003-of-00003.safetensors", dir);
    CHECK_OK(lpx_safetensors_save(path, 1, &name, &t, 0, NULL));
    lpx_tensor_release(t);
    edit_index(dir, "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"",
               "\"lm_head.weight\": \"model-00003-of-00003.safetensors\"");
    both_refuse(dir, "tensor 'lm_head.weight' is in both model-00002-of-00002.safetensors and "
                     "model-00003-of-00003.safetensors");
    /* the index puts model.norm.weight in shard 1; it is in shard 2 */
    copy_fixture(dir, NULL);
    edit_index(dir, "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"",
               "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"");
    both_refuse(dir, "tensor 'model.norm.weight' is in model-00002-of-00002.safetensors, but "
                     "model.safetensors.index.json's weight_map puts it in model-00001-of-00002.safetensors");
}

/* a weight_map value that is a number: the message used the entry after
 * freeing the index (ASan: heap-use-after-free); now one line naming it */
static void test_weight_map_not_string(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/notstr", outdir);
    copy_fixture(dir, NULL);
    edit_index(dir, "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"", "\"model.norm.weight\": 7");
    both_refuse(dir, "weight_map entry 'model.norm.weight' is not a file name");
    copy_fixture(dir, NULL);
    edit_index(dir, "\"weight_map\": {", "\"weight_map\": [], \"x\": {");
    both_refuse(dir, "has no weight_map object");
}

/* a FIFO in place of config.json, the index, a shard or model.safetensors:
 * refused at once (before, open() waited for a writer forever) */
static void test_fifo_refused(void)
{
    static const char *const files[] = {"config.json", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors", "model.safetensors"};
    char dir[600], path[900];
    snprintf(dir, sizeof dir, "%s/fifo", outdir);
    for (int i = 0; i < 4; i++) {
        copy_fixture(dir, NULL);
        if (i == 3) {   /* the single-file layout: no index */
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
            unlink(path);
        }
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
        CHECK(mkfifo(path, 0644) == 0);
        char want[1000];
        snprintf(want, sizeof want, i < 2 ? "'%s' is not a regular file" : "safetensors %s: not a regular file", path);
        both_refuse(dir, want);
    }
}

/* config.json as transformers reads it, or refused in one line */
static void test_config_refusals(void)
{
    char cfg_path[700], dir[600];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", fixture);
    char *cfg = slurp(cfg_path);
    if (!cfg) {
        CHECK(cfg != NULL);
        return;
    }
    static const char *const cases[][3] = {
        /* past int: was ignored (head_dim) or undefined (head_dim * heads) */
        {"\"head_dim\": 16", "\"head_dim\": 4294967312", "\"head_dim\" is 4294967312; it must be an integer in [1, 2147483647]"},
        {"\"head_dim\": 16", "\"head_dim\": 1073741824", "head_dim 1073741824 is not hidden_size / num_attention_heads"},
        {"\"head_dim\": 16", "\"head_dim\": 16.5", "\"head_dim\" is 16.5; it must be an integer"},
        {"\"hidden_size\": 64", "\"hidden_size\": 64.5", "\"hidden_size\" is 64.5; it must be an integer"},
        {"\"hidden_size\": 64", "\"hidden_size\": 1e300", "\"hidden_size\" is 1.0000000000000001e+300"},
        /* was silently num_attention_heads */
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3e10", "\"num_key_value_heads\" is 30000000000"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": \"2\"", "\"num_key_value_heads\" is the string \"2\""},
        {"\"max_position_embeddings\": 512", "\"max_position_embeddings\": 2147483648",
         "\"max_position_embeddings\" is 2147483648"},
        {"\"vocab_size\": 128", "\"vocab_size\": 128, \"vocab_size\": 256", "has the key \"vocab_size\" twice"},
        {"\"rope_type\": \"llama3\"", "\"rope_type\": \"llama3\", \"factor\": 2",
         "has the key \"factor\" twice"},
        /* factor 0 was read as "no scaling" */
        {"\"factor\": 8.0", "\"factor\": 0", "llama3 rope scaling \"factor\" is 0; it must be >= 1"},
        {"\"factor\": 8.0", "\"factor\": -2", "factor\" is -2; it must be >= 1"},
        {"\"factor\": 8.0", "\"factor\": \"8\"", "\"factor\" is the string \"8\"; it must be a finite number"},
        {"\"factor\": 8.0", "\"factor\": 1e999", "\"factor\" is inf; it must be a finite number"},
        /* a numeric rope_type was passed over for "default" */
        {"\"rope_type\": \"llama3\"", "\"rope_type\": 3", "\"rope_type\" is 3; it must be a string"},
        {"\"rope_type\": \"llama3\"", "\"rope_type\": \"dynamic\"", "rope type 'dynamic' is not supported"},
        {"\"rope_parameters\": {", "\"rope_scaling\": 5, \"rope_parameters\": {", "\"rope_scaling\" is 5; it must be an object"},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": \"no\"", "\"tie_word_embeddings\" is the string"},
        {"\"mlp_bias\": false", "\"mlp_bias\": 0", "\"mlp_bias\" is 0; it must be true or false"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": 1", "\"hidden_act\" is 1; it must be a string"},
        {"{", "\xEF\xBB\xBF{", "starts with a UTF-8 byte-order mark"},
        {"\"vocab_size\": 128\n}", "\"vocab_size\": 128\n}\n}", "has data after its JSON value"},
    };
    snprintf(dir, sizeof dir, "%s/cfg", outdir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *c = replaced(cfg, cases[i][0], cases[i][1]);
        copy_fixture(dir, c);
        char out[8192];
        int rc = eval_dir(dir, out, sizeof out);
        CHECKF(rc == 2 && strstr(out, cases[i][2]) && count_lines(out) == 1, "case %zu (%s): exit %d, want '%s': %s", i,
               cases[i][1], rc, cases[i][2], out);
        free(c);
    }
    /* lpx train reads the same reader: one case through it */
    char *c = replaced(cfg, "\"factor\": 8.0", "\"factor\": 0");
    copy_fixture(dir, c);
    free(c);
    both_refuse(dir, "\"factor\" is 0");
    /* null is an absent field (LlamaConfig's default), as in Python */
    c = replaced(cfg, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": null, \"kv\": 2");
    copy_fixture(dir, c);
    free(c);
    char out[8192];
    int rc = eval_dir(dir, out, sizeof out);
    /* the default (4 kv heads) does not fit the fixture's GQA weights */
    CHECKF(rc == 2 && strstr(out, "k_proj.weight is bf16 [32, 64]; config.json says [64, 64]"), "null kv: %d %s", rc,
           out);
    free(cfg);
}

/* hf_logits.py's exit code on folder DIR against lpx eval's logits LG
 * (eos: the generation config's eos_token_id to expect, or NULL); 77 when
 * the test interpreter has no torch or transformers (*why says which) */
static int transformers_check(const char *dir, const char *tokens, const char *lg, const char *eos, char *log, size_t n)
{
    char script[600], cmd[4096];
    snprintf(script, sizeof script, "%s", fixture);
    char *s = strstr(script, "/data/llama_tiny");
    if (!s) {
        snprintf(log, n, "cannot find tests/python/hf_logits.py from the fixture path %s", fixture);
        return 77;
    }
    snprintf(s, sizeof script - (size_t)(s - script), "/python/hf_logits.py");
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' '%s' %s%s%s 2>&1", python, script, dir, tokens, lg, eos ? "'" : "",
             eos ? eos : "", eos ? "'" : "");
    FILE *p = popen(cmd, "r");
    size_t k = p ? fread(log, 1, n - 1, p) : 0;
    while (k && (log[k - 1] == '\n' || log[k - 1] == ' ')) k--;
    log[k] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* DIR's text parsed, or NULL (CHECKed) */
static cJSON *json_of(const char *path)
{
    char *text = slurp(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECKF(j != NULL, "%s is not JSON", path);
    free(text);
    return j;
}

/* the files of a model folder a tokenizer and generation come with */
static const char *const side_files[][2] = {
    {"tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n"},
    {"tokenizer_config.json", "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n"},
    {"special_tokens_map.json", "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n"},
    {"generation_config.json", "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"do_sample\": true, "
                               "\"temperature\": 0.6, \"top_p\": 0.9}\n"},
    {"README.md", "a model card\n"},
};

static bool same_file_bytes(const char *a, const char *b)
{
    char *x = slurp(a), *y = slurp(b);
    bool same = x && y && !strcmp(x, y);
    free(x);
    free(y);
    return same;
}

/* --init DIR then --save-hf OUT (issue 35): OUT/config.json is DIR's
 * object field by field (bos/eos/pad ids, max_position_embeddings 131072,
 * pretraining_tp, the 5.x rope_parameters, transformers_version: all as
 * read) except the dtype, now float32, the weights lpx writes; every
 * other file of DIR that is not weights is copied byte for byte (a link
 * to a file inside DIR as that file), a link out of DIR is not (and
 * said), a subfolder is not. Before, config.json was lpx's own: no
 * bos/eos, max_position_embeddings rope_orig * factor (here 512, the
 * Llama 3.1 config's 131072 became 65536), no generation config nor
 * tokenizer. Then transformers loads OUT with lpx eval's logits and the
 * generation config's eos (when the test interpreter has transformers). */
static void test_save_hf_round_trip(void)
{
    char in[600], out[600], ids[600], path[900], path2[900], args[4096];
    static char log[65536];
    snprintf(in, sizeof in, "%s/rt-in", outdir);
    snprintf(out, sizeof out, "%s/rt-out", outdir);
    snprintf(ids, sizeof ids, "%s/ids.bin", outdir);
    write_ids(ids);
    snprintf(path, sizeof path, "%s/config.json", fixture);
    char *cfg = slurp(path), *c1 = cfg ? replaced(cfg, "\"max_position_embeddings\": 512",
                                                  "\"max_position_embeddings\": 131072") : NULL;
    CHECK(c1 != NULL);
    if (!c1) {
        free(cfg);
        return;
    }
    copy_fixture(in, c1);
    free(cfg);
    free(c1);
    for (size_t i = 0; i < sizeof side_files / sizeof *side_files; i++) {
        snprintf(path, sizeof path, "%s/%s", in, side_files[i][0]);
        spit(path, side_files[i][1]);
    }
    /* a link inside the folder (followed), one out of it (not), a subfolder (not) */
    snprintf(path, sizeof path, "%s/tokenizer.model", in);
    CHECK(symlink("tokenizer.json", path) == 0);
    snprintf(path2, sizeof path2, "%s/secret.txt", outdir);
    spit(path2, "not for the model folder\n");
    snprintf(path, sizeof path, "%s/notes.txt", in);
    CHECK(symlink(path2, path) == 0);
    snprintf(path, sizeof path, "%s/original", in);
    CHECK(mkdir(path, 0777) == 0);
    snprintf(path, sizeof path, "%s/original/params.json", in);
    spit(path, "{}\n");
    snprintf(args, sizeof args, "train --init '%s' --recipe f32 --ranks 1 --micro 1 --batch 2 --steps 2 --seq 16 "
             "--lr 0.01 --eval 1 --sample 0 --data '%s' --save-hf '%s' --out '%s/rt-run'", in, ids, out, outdir);
    int rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 0, "train --init --save-hf exited %d: %s", rc, log);
    CHECKF(strstr(log, "warning: --save-hf will not copy") && strstr(log, "notes.txt: a symbolic link out of the folder"),
           "no warning for the link out of the folder: %s", log);
    /* config.json field by field */
    snprintf(path, sizeof path, "%s/config.json", in);
    snprintf(path2, sizeof path2, "%s/config.json", out);
    cJSON *a = json_of(path), *b = json_of(path2), *f;
    int fields = 0;
    cJSON_ArrayForEach(f, a) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(b, f->string);
        fields++;
        if (!strcmp(f->string, "dtype")) {
            CHECKF(cJSON_IsString(g) && !strcmp(g->valuestring, "float32"), "dtype is not float32 (the weights lpx "
                   "writes)");
            continue;
        }
        char *want = cJSON_PrintUnformatted(f), *got = g ? cJSON_PrintUnformatted(g) : NULL;
        CHECKF(g && cJSON_Compare(f, g, true), "config.json \"%s\": %s, --init's was %s", f->string,
               got ? got : "absent", want);
        cJSON_free(want);
        cJSON_free(got);
    }
    cJSON_ArrayForEach(f, b) CHECKF(cJSON_GetObjectItemCaseSensitive(a, f->string), "config.json gained \"%s\"",
                                    f->string);
    CHECKF(fields >= 20, "only %d fields compared", fields);
    cJSON_Delete(a);
    cJSON_Delete(b);
    /* the files */
    for (size_t i = 0; i < sizeof side_files / sizeof *side_files; i++) {
        snprintf(path, sizeof path, "%s/%s", in, side_files[i][0]);
        snprintf(path2, sizeof path2, "%s/%s", out, side_files[i][0]);
        CHECKF(same_file_bytes(path, path2), "%s was not copied as it is", side_files[i][0]);
    }
    struct stat sb;
    snprintf(path, sizeof path, "%s/tokenizer.json", in);
    snprintf(path2, sizeof path2, "%s/tokenizer.model", out);
    CHECKF(lstat(path2, &sb) == 0 && S_ISREG(sb.st_mode) && same_file_bytes(path, path2),
           "the link inside the folder was not copied as its file");
    snprintf(path, sizeof path, "%s/notes.txt", out);
    CHECKF(!exists(path), "a link out of the --init folder was followed");
    snprintf(path, sizeof path, "%s/original", out);
    CHECKF(!exists(path), "a subfolder was copied");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    CHECKF(!exists(path), "the --init folder's index was copied");
    /* lpx reads it back; transformers too, with lpx's logits */
    char lg[700];
    snprintf(lg, sizeof lg, "%s/rt-logits.safetensors", outdir);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s'", out, fixture, lg);
    rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 0, "lpx eval of the saved folder: %d %s", rc, log);
    if (rc) return;
    char tokens[700];
    snprintf(tokens, sizeof tokens, "%s/tokens.bin", fixture);
    rc = transformers_check(out, tokens, lg, "[2, 3]", log, sizeof log);
    if (rc == 77) SKIP_CASE("transformers round trip: %s (%s)", log, python);
    CHECKF(rc == 0, "transformers on the saved folder (%s): exit %d: %s", python, rc, log);
    const char *line = strstr(log, "max |transformers");
    if (line) printf("  %.*s\n", (int)strcspn(line, "\n"), line);
}

/* A file of the --save-hf folder that differs from the --init folder's is
 * never overwritten: refused before the first step (exit 2, one line
 * naming both), nothing written; the same bytes are fine. */
static void test_save_hf_keeps_users_files(void)
{
    char in[600], out[600], ids[600], path[900], args[4096];
    static char log[65536];
    snprintf(in, sizeof in, "%s/keep-in", outdir);
    snprintf(out, sizeof out, "%s/keep-out", outdir);
    snprintf(ids, sizeof ids, "%s/ids.bin", outdir);
    write_ids(ids);
    copy_fixture(in, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", in);
    spit(path, side_files[0][1]);
    CHECK(mkdir(out, 0777) == 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    spit(path, "{\"mine\": true}\n");
    snprintf(args, sizeof args, "train --init '%s' --recipe f32 --ranks 1 --micro 1 --batch 2 --steps 1 --seq 16 "
             "--eval 1 --sample 0 --data '%s' --save-hf '%s' --out '%s/keep-run'", in, ids, out, outdir);
    int rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 2 && strstr(log, "tokenizer.json' differs from --init's") && strstr(log, "does not overwrite it") &&
           count_lines(log) == 1, "a different tokenizer.json: %d %s", rc, log);
    char *t = slurp(path);
    CHECKF(t && !strcmp(t, "{\"mine\": true}\n"), "the user's tokenizer.json was changed");
    free(t);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    CHECKF(!exists(path), "a model was written after the refusal");
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    spit(path, side_files[0][1]);
    rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 0, "the same tokenizer.json: %d %s", rc, log);
}

/* --model llama3.2-1b from scratch writes the published
 * max_position_embeddings (131072), not rope_orig * factor (262144) */
static void test_save_hf_preset_max_position(void)
{
    char out[600], args[4096], path[900];
    static char log[65536];
    snprintf(out, sizeof out, "%s/preset-out", outdir);
    snprintf(args, sizeof args, "train --model llama3.2-1b --dim 32 --heads 4 --kv-heads 2 --ffn 32 --layers 1 "
             "--recipe f32 --ranks 1 --micro 1 --batch 1 --steps 1 --seq 16 --eval 1 --sample 0 --data '%s' "
             "--save-hf '%s' --out '%s/preset-run'", corpus, out, outdir);
    int rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 0, "train --model llama3.2-1b --save-hf: %d %s", rc, log);
    snprintf(path, sizeof path, "%s/config.json", out);
    cJSON *c = rc == 0 ? json_of(path) : NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "max_position_embeddings");
    CHECKF(cJSON_IsNumber(m) && m->valuedouble == 131072, "max_position_embeddings %g", m ? m->valuedouble : -1);
    cJSON_Delete(c);
}

/* A Llama whose sizes are no multiple of 32 (intermediate_size 200,
 * hidden 48 with 3 heads of 16: transformers takes both) trains one bf16
 * step, saves, and loads back in lpx eval under every recipe, with a
 * finite loss; transformers gives lpx's logits. Before, --dim 48 and
 * --ffn 200 (and `lpx eval` of such a config.json) were refused with "not a
 * positive multiple of 32" for every recipe; no recipe needs it (MX pads
 * the last block of 32 of a row, NF4 the last of 64, float8-blockwise its
 * partial 128 blocks), so none refuses it. */
static void test_sizes_not_multiples_of_32(void)
{
    char out[600], args[4096], ids[700];
    static char log[65536];
    snprintf(out, sizeof out, "%s/odd", outdir);
    snprintf(ids, sizeof ids, "%s/odd-ids.bin", outdir);
    write_ids(ids);
    snprintf(args, sizeof args, "train --dim 48 --heads 3 --kv-heads 1 --ffn 200 --layers 2 --vocab 128 --recipe bf16 "
             "--ranks 2 --micro 2 --batch 2 --steps 1 --seq 16 --eval 1 --sample 0 --data '%s' --save-hf '%s' "
             "--out '%s/odd-run'", ids, out, outdir);
    int rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 0, "train --dim 48 --ffn 200: %d %s", rc, log);
    if (rc) return;
    static const char *const recipes[] = {"f32", "bf16", "float8-tensorwise", "float8-rowwise", "float8-delayed",
                                          "float8-blockwise", "nf4-qlora", "mxfp8", "mxfp4"};
    for (size_t i = 0; i < sizeof recipes / sizeof *recipes; i++) {
        snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --recipe %s", out, fixture, recipes[i]);
        rc = run_limited(args, log, sizeof log);
        double l = loss_of(log);
        CHECKF(rc == 0 && isfinite(l), "eval --recipe %s of intermediate_size 200: %d %s", recipes[i], rc, log);
    }
    char lg[700];
    snprintf(lg, sizeof lg, "%s/odd-logits.safetensors", outdir);
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --logits '%s'", out, fixture, lg);
    rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 0, "eval --logits: %d %s", rc, log);
    char tokens[700];
    snprintf(tokens, sizeof tokens, "%s/tokens.bin", fixture);
    rc = transformers_check(out, tokens, lg, NULL, log, sizeof log);
    if (rc == 77) SKIP_CASE("transformers check: %s (%s)", log, python);
    CHECKF(rc == 0, "transformers on hidden 48 / intermediate 200 (%s): exit %d: %s", python, rc, log);
}

/* `lpx eval --recipe R` for every recipe `lpx train` has (nf4-qlora and
 * the MX ones were refused): on the fixture, a finite loss within a bound
 * of f32's that follows from each format, and (for the quantized ones) not
 * f32's exactly, so the recipe really ran. Measured on the fixture
 * (f32 5.400139): bf16 0 (the weights are bf16 already and the CPU
 * computes in f32), float8 tensorwise 0.21 %, rowwise 0.34 %, delayed
 * 0.05 %, blockwise 0.02 %, nf4-qlora 0.92 %, mxfp8 0.49 %, mxfp4 0.46 %.
 * Bounds: bf16 1e-6 relative; e4m3 (float8, mxfp8) keeps 3 mantissa bits,
 * a relative step of 2^-4 per value that averages over the 64 and 96
 * products of each dot: 2 %, 4x to 100x the measured; NF4 (16 levels per
 * block of 64) and mxfp4 (e2m1, one mantissa bit under a power-of-two
 * block scale) are 4-bit: 5 %, 5x the measured. A recipe that did not
 * quantize, or that broke the model (a loss off by its scale: tens of %),
 * fails either way. */
static void test_eval_every_recipe(void)
{
    static const struct { const char *r; double tol; bool exact; } cases[] = {
        {"bf16", 1e-6, true},
        {"float8-tensorwise", 0.02, false},
        {"float8-rowwise", 0.02, false},
        {"float8-delayed", 0.02, false},
        {"float8-blockwise", 0.02, false},
        {"nf4-qlora", 0.05, false},
        {"mxfp8", 0.02, false},
        {"mxfp4", 0.05, false},
    };
    char args[2048];
    static char log[65536];
    int rc = eval_dir(fixture, log, sizeof log);
    double ref = loss_of(log);
    CHECKF(rc == 0 && isfinite(ref), "eval f32: %d %s", rc, log);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --recipe %s", fixture, fixture,
                 cases[i].r);
        rc = run_limited(args, log, sizeof log);
        double l = loss_of(log), rel = fabs(l - ref) / ref;
        CHECKF(rc == 0 && isfinite(l) && rel <= cases[i].tol, "eval --recipe %s: exit %d, loss %.6f, f32 %.6f "
               "(%.2f %% off, bound %.2f %%): %s", cases[i].r, rc, l, ref, 100 * rel, 100 * cases[i].tol, log);
        CHECKF(cases[i].exact || l != ref, "eval --recipe %s gave f32's loss exactly: nothing was quantized",
               cases[i].r);
        printf("  %-18s loss %.6f (f32 %.6f, %.3f %% off, bound %g %%)\n", cases[i].r, l, ref, 100 * rel,
               100 * cases[i].tol);
    }
    /* nf4-qlora's base is frozen: no gradient to write */
    snprintf(args, sizeof args, "eval --init '%s' --tokens '%s/tokens.bin' --recipe nf4-qlora --grads '%s/g.safetensors'",
             fixture, fixture, outdir);
    rc = run_limited(args, log, sizeof log);
    CHECKF(rc == 2 && strstr(log, "--grads with --recipe nf4-qlora") && count_lines(log) == 1, "nf4 --grads: %d %s",
           rc, log);
}

int main(void)
{
    exe = getenv("LPX_TEST_LPX_EXE");
    const char *fx = getenv("LPX_TEST_LLAMA_FIXTURE"), *cp = getenv("LPX_TEST_CORPUS");
    if (!exe || !fx || !cp) {
        printf("LPX_TEST_LPX_EXE / LPX_TEST_LLAMA_FIXTURE / LPX_TEST_CORPUS not set: skipping\n");
        return 77;
    }
    snprintf(fixture, sizeof fixture, "%s", fx);
    snprintf(corpus, sizeof corpus, "%s", cp);
    /* the test interpreter (tests/meson.build: the .test-venv's when there is one) */
    snprintf(python, sizeof python, "%s", getenv("LPX_TEST_PYTHON") ? getenv("LPX_TEST_PYTHON") : "python3");
    snprintf(outdir, sizeof outdir, "/tmp/lpx-test-hf.%ld", (long)getpid());
    mkdir(outdir, 0777);
    RUN(test_config_refusals);
    RUN(test_weight_map_not_string);
    RUN(test_tensor_in_two_shards);
    RUN(test_fifo_refused);
    RUN(test_save_hf_over_sharded);
    RUN(test_save_hf_round_trip);
    RUN(test_save_hf_keeps_users_files);
    RUN(test_save_hf_preset_max_position);
    RUN(test_sizes_not_multiples_of_32);
    RUN(test_eval_every_recipe);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", outdir);
    if (!getenv("LPX_TEST_KEEP") && system(cmd) != 0) printf("note: could not remove %s\n", outdir);
    return CHECK_DONE();
}
