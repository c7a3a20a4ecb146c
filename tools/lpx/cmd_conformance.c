/* `lpx conformance`: the contract suite of tools/conformance/ over every
 * registered kind (or the named ones, or those a plugin brings), one child
 * process per case so that a kind that crashes or hangs fails its cases
 * and the run goes on. One line per case, a summary line, a JUnit file on
 * request, exit status 1 when a case failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"
#include "commands.h"
#include "cf_runner.h"
#include "conformance.h"

#define MAX_LIST 32

typedef struct result {
    char name[200];
    cf_run_outcome outcome;
    char detail[1024];
    double seconds;
} result;

typedef struct run {
    result *v;
    int n, cap;
    int passed, failed, skipped;
    int strict;
} run;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lpx conformance [--kind NAME]... [--plugin PATH]... [--junit FILE]\n"
            "                       [--timeout SEC] [--strict] [--list]\n"
            "\n"
            "Runs the kind contracts (declares, flatten_unflatten, logical_dtype,\n"
            "quantize/<distribution>, op/<op>, all_gather/world1..4, shard_unit,\n"
            "refusal) against every registered kind, the --kind ones, or (with\n"
            "--plugin and no --kind) the kinds the plugins bring. Each case runs in\n"
            "a child process; a crash or a hang (default timeout 30 s) fails it.\n"
            "  --strict   count skipped cases as failures\n"
            "  --list     print the case names without running them\n"
            "Exit status: 0 all passed, 1 a case failed, 2 usage error.\n");
}

static result *record(run *r, const char *name, cf_run_outcome o, const char *detail, double secs)
{
    if (r->n == r->cap) {
        int c = r->cap ? 2 * r->cap : 64;
        result *v = realloc(r->v, (size_t)c * sizeof *v);
        if (!v) return NULL;
        r->v = v;
        r->cap = c;
    }
    result *x = &r->v[r->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->outcome = o;
    snprintf(x->detail, sizeof x->detail, "%s", detail);
    x->seconds = secs;
    if (o == CFR_PASS) r->passed++;
    else if (o == CFR_SKIP && !r->strict) r->skipped++;
    else r->failed++;
    static const char *const tag[] = {"PASS", "FAIL", "SKIP"};
    printf("%s %s%s%s\n", o == CFR_SKIP && r->strict ? "FAIL" : tag[o], name, detail[0] ? ": " : "", detail);
    fflush(stdout);
    return x;
}

/* ---- children ------------------------------------------------------ */

static int child_case(const void *ctx, char *detail, size_t len)
{
    return (int)cf_run(ctx, detail, len);
}

static int child_load(const void *ctx, char *detail, size_t len)
{
    const lpx_plugin *p = NULL;
    lpx_status st = lpx_plugin_load(ctx, &p);
    if (st) {
        snprintf(detail, len, "%s", lpx_last_error());
        return CFR_FAIL;
    }
    int nd, no, nk, nkern, nfb, nbe;
    lpx_plugin_registered(p, &nd, &no, &nk, &nkern, &nfb, &nbe);
    snprintf(detail, len, "'%s' %s: %d dtypes, %d ops, %d kinds, %d kernels, %d fallbacks", lpx_plugin_name(p),
             lpx_plugin_version(p), nd, no, nk, nkern, nfb);
    return CFR_PASS;
}

/* ---- JUnit ---------------------------------------------------------- */

static void xml_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if ((unsigned char)*s < 0x20 && *s != '\t') fputc(' ', f);   /* not allowed in XML 1.0 */
            else fputc(*s, f);
        }
    }
}

static int write_junit(const run *r, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return -1;
    }
    double total = 0;
    for (int i = 0; i < r->n; i++) total += r->v[i].seconds;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<testsuites name=\"lpx conformance\" tests=\"%d\" failures=\"%d\" skipped=\"%d\" time=\"%.3f\">\n",
            r->n, r->failed, r->skipped, total);
    fprintf(f, "  <testsuite name=\"lpx conformance\" tests=\"%d\" failures=\"%d\" errors=\"0\" skipped=\"%d\" "
               "time=\"%.3f\">\n", r->n, r->failed, r->skipped, total);
    for (int i = 0; i < r->n; i++) {
        const result *x = &r->v[i];
        const char *slash = strchr(x->name, '/');
        int klen = slash ? (int)(slash - x->name) : (int)strlen(x->name);
        fprintf(f, "    <testcase classname=\"lpx.conformance.");
        char cls[200];
        snprintf(cls, sizeof cls, "%.*s", klen, x->name);
        xml_escaped(f, cls);
        fprintf(f, "\" name=\"");
        xml_escaped(f, slash ? slash + 1 : x->name);
        fprintf(f, "\" time=\"%.3f\"", x->seconds);
        bool fail = x->outcome == CFR_FAIL || (x->outcome == CFR_SKIP && r->strict);
        if (fail || x->outcome == CFR_SKIP) {
            fprintf(f, ">\n      <%s message=\"", fail ? "failure" : "skipped");
            xml_escaped(f, x->detail);
            fprintf(f, "\"/>\n    </testcase>\n");
        } else {
            fprintf(f, ">\n      <system-out>");
            xml_escaped(f, x->detail);
            fprintf(f, "</system-out>\n    </testcase>\n");
        }
    }
    fprintf(f, "  </testsuite>\n</testsuites>\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- main ----------------------------------------------------------- */

int lpx_cmd_conformance(int argc, char **argv)
{
    const char *kinds_arg[MAX_LIST], *plugins_arg[MAX_LIST], *junit = NULL;
    int nkinds_arg = 0, nplugins_arg = 0, list = 0;
    double timeout = 30;
    run r = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--kind") && has_val && nkinds_arg < MAX_LIST) kinds_arg[nkinds_arg++] = argv[++i];
        else if (!strcmp(a, "--plugin") && has_val && nplugins_arg < MAX_LIST) plugins_arg[nplugins_arg++] = argv[++i];
        else if (!strcmp(a, "--junit") && has_val) junit = argv[++i];
        else if (!strcmp(a, "--timeout") && has_val) {
            char *end;
            timeout = strtod(argv[++i], &end);
            if (*end || !(timeout > 0)) {
                fprintf(stderr, "lpx conformance: --timeout needs a positive number of seconds, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--strict")) r.strict = 1;
        else if (!strcmp(a, "--list")) list = 1;
        else {
            int valued = !strcmp(a, "--kind") || !strcmp(a, "--plugin") || !strcmp(a, "--junit");
            fprintf(stderr, "lpx conformance: %s '%s'\n\n", valued ? "missing value (or too many) for" : "unknown option", a);
            usage(stderr);
            return 2;
        }
    }

    /* plugins: loaded in a child first, so one that crashes or hangs in
     * its init is a failing case instead of the end of the run */
    const lpx_kind *from_plugins[64];
    int nfrom = 0, any_plugin_loaded = 0;
    for (int i = 0; i < nplugins_arg; i++) {
        char name[200], detail[1024];
        double secs;
        snprintf(name, sizeof name, "plugin/load %s", plugins_arg[i]);
        cf_run_outcome o = list ? CFR_PASS : cf_run_isolated(child_load, plugins_arg[i], timeout, detail, sizeof detail, &secs);
        if (o != CFR_PASS) {
            record(&r, name, o, detail, secs);
            continue;
        }
        int before = lpx_kind_count();
        lpx_status st = lpx_plugin_load(plugins_arg[i], NULL);
        if (!list) record(&r, name, st ? CFR_FAIL : CFR_PASS, st ? lpx_last_error() : detail, secs);
        if (st) continue;
        any_plugin_loaded = 1;
        for (int k = before; k < lpx_kind_count() && nfrom < 64; k++) from_plugins[nfrom++] = lpx_kind_at(k);
    }

    /* the kinds under test */
    const lpx_kind *kinds[64];
    int nk = 0;
    if (nkinds_arg) {
        for (int i = 0; i < nkinds_arg; i++) {
            const lpx_kind *k = NULL;
            if (lpx_kind_find(kinds_arg[i], &k) == LPX_OK) kinds[nk++] = k;
            else {
                char name[200];
                snprintf(name, sizeof name, "%s/exists", kinds_arg[i]);
                record(&r, name, CFR_FAIL, "no kind of this name is registered", 0);
            }
        }
    } else if (nplugins_arg && (nfrom || !any_plugin_loaded)) {
        /* the plugins' own kinds (none if they all failed to load) */
        for (int i = 0; i < nfrom; i++) kinds[nk++] = from_plugins[i];
    } else {
        /* everything (also when --plugin named an already loaded plugin) */
        for (int i = 0; i < lpx_kind_count() && nk < 64; i++) kinds[nk++] = lpx_kind_at(i);
    }

    cf_case *cases = NULL;
    int ncases = 0, capcases = 0;
    for (int i = 0; i < nk; i++)
        if (cf_cases_for_kind(kinds[i], &cases, &ncases, &capcases)) {
            fprintf(stderr, "lpx conformance: out of memory listing cases\n");
            free(cases);
            free(r.v);
            return 1;
        }
    if (list) {
        for (int i = 0; i < ncases; i++) printf("%s\n", cases[i].name);
        free(cases);
        free(r.v);
        return 0;
    }
    for (int i = 0; i < ncases; i++) {
        char detail[1024];
        double secs = 0;
        cf_run_outcome o = cases[i].skip[0] ? CFR_SKIP
                                            : cf_run_isolated(child_case, &cases[i], timeout, detail, sizeof detail, &secs);
        if (cases[i].skip[0]) snprintf(detail, sizeof detail, "%s", cases[i].skip);
        record(&r, cases[i].name, o, detail, secs);
    }
    free(cases);
    if (r.skipped) printf("%d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped);
    else printf("%d passed, %d failed\n", r.passed, r.failed);
    int rc = r.failed ? 1 : 0;
    if (junit && write_junit(&r, junit)) {
        fprintf(stderr, "lpx conformance: cannot write the JUnit file '%s'\n", junit);
        rc = 1;
    }
    free(r.v);
    return rc;
}
