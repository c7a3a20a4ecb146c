/* Shared reporting and timing for `lpx bench` subcommands (see
 * bench_report.h). */
#include "bench_report.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "lpx/lpx.h"

double lpx_bench_na(void) { return NAN; }
bool lpx_bench_has(double x) { return !isnan(x); }

static char *dup_or_null(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void lpx_bench_report_init(lpx_bench_report *r, const char *bench, bool json)
{
    memset(r, 0, sizeof *r);
    r->bench = bench;
    r->json = json;
    r->out = stdout;
}

static void json_str(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x)
{
    if (!lpx_bench_has(x) || isinf(x)) fputs("null", f);
    else fprintf(f, "%.6g", x);
}

static double ratio(double v, double base)
{
    return lpx_bench_has(v) && lpx_bench_has(base) && base > 0 ? v / base : NAN;
}

static void print_json_row(const lpx_bench_report *r, const lpx_bench_row *row)
{
    FILE *f = r->out;
    fputs("{\"bench\": ", f);
    json_str(f, r->bench);
    fputs(", \"case\": ", f);
    json_str(f, row->case_name);
    fputs(", \"value\": ", f);
    json_num(f, row->value);
    fputs(", \"unit\": ", f);
    json_str(f, row->unit);
    fputs(", \"baseline\": ", f);
    json_num(f, row->baseline);
    fputs(", \"ratio\": ", f);
    json_num(f, ratio(row->value, row->baseline));
    fputs(", \"baseline_case\": ", f);
    json_str(f, lpx_bench_has(row->baseline) ? row->baseline_case : NULL);
    if (lpx_bench_has(row->compare)) {
        fputs(", \"compare\": ", f);
        json_num(f, row->compare);
        fputs(", \"compare_ratio\": ", f);
        json_num(f, ratio(row->value, row->compare));
        fputs(", \"compare_case\": ", f);
        json_str(f, row->compare_case);
    }
    if (lpx_bench_has(row->goal)) {
        fputs(", \"goal\": ", f);
        json_num(f, row->goal);
        fputs(", \"goal_met\": ", f);
        fputs(lpx_bench_has(row->value) ? (row->value <= row->goal ? "true" : "false") : "null", f);
    }
    if (row->note) {
        fputs(", \"note\": ", f);
        json_str(f, row->note);
    }
    fputs("}\n", f);
    fflush(f);
}

void lpx_bench_report_add(lpx_bench_report *r, const lpx_bench_row *row)
{
    if (r->json) print_json_row(r, row);
    if (lpx_bench_has(row->goal) && lpx_bench_has(row->value)) {
        if (row->value <= row->goal) r->goals_met++;
        else r->goals_missed++;
    }
    if (r->nrows == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        lpx_bench_row *g = realloc(r->rows, (size_t)cap * sizeof *g);
        if (!g) {
            r->oom = true;
            return;
        }
        r->rows = g;
        r->cap = cap;
    }
    lpx_bench_row *d = &r->rows[r->nrows++];
    *d = *row;
    d->case_name = dup_or_null(row->case_name ? row->case_name : "?");
    d->unit = dup_or_null(row->unit);
    d->baseline_case = dup_or_null(row->baseline_case);
    d->compare_case = dup_or_null(row->compare_case);
    d->note = dup_or_null(row->note);
}

void lpx_bench_report_note(lpx_bench_report *r, const char *fmt, ...)
{
    FILE *f = r->json ? stderr : r->out;
    va_list ap;
    va_start(ap, fmt);
    fputs("# ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
}

/* Numbers with about four significant digits, no exponent. */
static void fmt_value(char *buf, size_t len, double v)
{
    if (!lpx_bench_has(v)) snprintf(buf, len, "n/a");
    else if (fabs(v) < 10) snprintf(buf, len, "%.2f", v);
    else if (fabs(v) < 1000) snprintf(buf, len, "%.1f", v);
    else snprintf(buf, len, "%.0f", v);
}

static void fmt_ratio(char *buf, size_t len, double q, const char *name)
{
    if (!lpx_bench_has(q)) {
        buf[0] = 0;
        return;
    }
    char num[32];
    if (q < 0.1) snprintf(num, sizeof num, "%.2gx", q);   /* 0.0049x, not 0.00x */
    else if (q < 10) snprintf(num, sizeof num, "%.2fx", q);
    else snprintf(num, sizeof num, "%.0fx", q);
    if (name) snprintf(buf, len, "%s %s", num, name);
    else snprintf(buf, len, "%s", num);
}

static int max_int(int a, int b) { return a > b ? a : b; }

void lpx_bench_report_finish(lpx_bench_report *r)
{
    if (!r->json && r->nrows) {
        /* one baseline name for the column header when all rows agree */
        const char *base = NULL;
        bool same = true;
        for (int i = 0; i < r->nrows; i++) {
            const char *b = lpx_bench_has(r->rows[i].baseline) ? r->rows[i].baseline_case : NULL;
            if (!b) continue;
            if (!base) base = b;
            else if (strcmp(base, b)) same = false;
        }
        char base_hdr[96];
        snprintf(base_hdr, sizeof base_hdr, "vs %s", same && base ? base : "baseline");

        enum { NCOL = 6 };
        const char *hdr[NCOL] = {"case", "value", base_hdr, "vs PyTorch / other", "goal", "note"};
        char (*cells)[NCOL][160] = calloc((size_t)r->nrows, sizeof *cells);
        if (!cells) {
            fprintf(r->out, "(out of memory: table omitted)\n");
        } else {
            int w[NCOL];
            for (int c = 0; c < NCOL; c++) w[c] = (int)strlen(hdr[c]);
            for (int i = 0; i < r->nrows; i++) {
                const lpx_bench_row *row = &r->rows[i];
                char v[48];
                fmt_value(v, sizeof v, row->value);
                snprintf(cells[i][0], sizeof cells[i][0], "%s", row->case_name);
                if (lpx_bench_has(row->value) && row->unit)
                    snprintf(cells[i][1], sizeof cells[i][1], "%s %s", v, row->unit);
                else
                    snprintf(cells[i][1], sizeof cells[i][1], "%s", v);
                fmt_ratio(cells[i][2], sizeof cells[i][2], ratio(row->value, row->baseline),
                          same ? NULL : row->baseline_case);
                fmt_ratio(cells[i][3], sizeof cells[i][3], ratio(row->value, row->compare), row->compare_case);
                if (lpx_bench_has(row->goal)) {
                    char g[48];
                    fmt_value(g, sizeof g, row->goal);
                    snprintf(cells[i][4], sizeof cells[i][4], "<= %s %s%s", g, row->unit ? row->unit : "",
                             !lpx_bench_has(row->value) ? "" : row->value <= row->goal ? "  met" : "  MISSED");
                }
                snprintf(cells[i][5], sizeof cells[i][5], "%s", row->note ? row->note : "");
                for (int c = 0; c < NCOL; c++) w[c] = max_int(w[c], (int)strlen(cells[i][c]));
            }
            /* case and note left-aligned, numbers right-aligned */
            fprintf(r->out, "%-*s  %*s  %*s  %-*s  %-*s  %s\n", w[0], hdr[0], w[1], hdr[1], w[2], hdr[2], w[3],
                    hdr[3], w[4], hdr[4], hdr[5]);
            int total = w[0] + w[1] + w[2] + w[3] + w[4] + (int)strlen(hdr[5]) + 10;
            for (int i = 0; i < total; i++) fputc('-', r->out);
            fputc('\n', r->out);
            for (int i = 0; i < r->nrows; i++) {
                char line[1200];
                snprintf(line, sizeof line, "%-*s  %*s  %*s  %-*s  %-*s  %s", w[0], cells[i][0], w[1], cells[i][1],
                         w[2], cells[i][2], w[3], cells[i][3], w[4], cells[i][4], cells[i][5]);
                /* no trailing blanks when the last columns are empty */
                size_t n = strlen(line);
                while (n && line[n - 1] == ' ') line[--n] = 0;
                fprintf(r->out, "%s\n", line);
            }
            free(cells);
        }
    }
    if (r->goals_met + r->goals_missed)
        fprintf(r->json ? stderr : r->out, "lpx-bench-goals: %s met=%d missed=%d\n", r->bench, r->goals_met,
                r->goals_missed);
    if (r->oom) fprintf(stderr, "lpx bench: out of memory, some rows are missing from the table\n");
    for (int i = 0; i < r->nrows; i++) {
        free((void *)r->rows[i].case_name);
        free((void *)r->rows[i].unit);
        free((void *)r->rows[i].baseline_case);
        free((void *)r->rows[i].compare_case);
        free((void *)r->rows[i].note);
    }
    free(r->rows);
    r->rows = NULL;
    r->nrows = r->cap = 0;
    fflush(r->out);
}

/* ---- timing -------------------------------------------------------- */

void lpx_bench_opts_default(lpx_bench_opts *o)
{
    if (o->reps <= 0) o->reps = 101;
    if (!(o->batch_ms > 0)) o->batch_ms = 2;
    if (!(o->warmup_ms > 0)) o->warmup_ms = 50;
}

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b ? 1 : 0;
}

double lpx_bench_median(double *v, int n)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int lpx_bench_measure(lpx_bench_batch_fn fn, void *ctx, const lpx_bench_opts *opts, lpx_bench_stats *out)
{
    lpx_bench_opts o = opts ? *opts : (lpx_bench_opts){0};
    lpx_bench_opts_default(&o);
    int st;
    /* calibrate: double the batch until it takes a tenth of the target,
     * then scale; the calibration runs double as the first warm-up */
    int64_t n = 1;
    double t;
    for (;;) {
        uint64_t t0 = lpx_now_ns();
        if ((st = fn(ctx, n))) return st;
        t = (double)(lpx_now_ns() - t0);
        if (t >= o.batch_ms * 1e5 || n >= (INT64_C(1) << 40)) break;
        n *= 2;
    }
    double per = t / (double)n;
    int64_t batch = (int64_t)(o.batch_ms * 1e6 / (per > 0 ? per : 1));
    if (batch < 1) batch = 1;
    /* warm-up: caches, branch predictors, CPU frequency */
    uint64_t wend = lpx_now_ns() + (uint64_t)(o.warmup_ms * 1e6);
    do {
        if ((st = fn(ctx, batch))) return st;
    } while (lpx_now_ns() < wend);
    double *v = malloc((size_t)o.reps * sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < o.reps; i++) {
        uint64_t t0 = lpx_now_ns();
        if ((st = fn(ctx, batch))) {
            free(v);
            return st;
        }
        v[i] = (double)(lpx_now_ns() - t0) / (double)batch;
    }
    out->median_ns = lpx_bench_median(v, o.reps);   /* sorts v */
    out->min_ns = v[0];
    out->max_ns = v[o.reps - 1];
    out->batch = batch;
    out->reps = o.reps;
    free(v);
    return 0;
}
