/* Shared reporting and timing for every `lpx bench` subcommand.
 *
 * A bench collects rows (case, value, unit, optional baseline, optional
 * second comparison, optional goal, note) into an lpx_bench_report. Without
 * --json the rows become one aligned table on stdout when the report is
 * finished; with --json each row is printed at once as one JSON object per
 * line:
 *   {"bench": "dispatch", "case": "...", "value": 23.1, "unit": "ns",
 *    "baseline": 11.9, "ratio": 1.94, ...}
 * with null for absent numbers, so scripts can diff runs line by line.
 *
 * lpx_bench_measure times a callable that runs a batch of iterations:
 * warm-up, batch size calibrated to a target batch time, then many timed
 * batches; it reports the median (and min) ns per iteration. */
#ifndef LPX_TOOLS_BENCH_REPORT_H
#define LPX_TOOLS_BENCH_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* One result line. Numbers that are absent are NAN (lpx_bench_na()). */
typedef struct lpx_bench_row {
    const char *case_name;      /* required */
    double value;               /* NAN: not available (see note) */
    const char *unit;           /* "ns", "GB/s", ... */
    double baseline;            /* NAN: no baseline */
    const char *baseline_case;  /* what baseline is (table column header uses it) */
    double compare;             /* a second reference, NAN: none */
    const char *compare_case;   /* its name, printed beside the ratio */
    double goal;                /* NAN: none; met when value <= goal */
    const char *note;           /* free text, may be NULL */
} lpx_bench_row;

typedef struct lpx_bench_report {
    const char *bench;          /* "dispatch" */
    bool json;
    FILE *out;                  /* stdout */
    int nrows, cap;
    lpx_bench_row *rows;        /* copies (strings duplicated) */
    bool oom;
    int goals_met, goals_missed; /* over the rows with a goal and a value */
} lpx_bench_report;

/** NAN, for absent numbers. */
double lpx_bench_na(void);
/** True if x is present (not NAN). */
bool lpx_bench_has(double x);

/** Prepares a report for `bench` (string must outlive the report). */
void lpx_bench_report_init(lpx_bench_report *r, const char *bench, bool json);
/** Adds a row (strings copied). In JSON mode prints it at once. A row
 *  with a baseline gets ratio = value / baseline. */
void lpx_bench_report_add(lpx_bench_report *r, const lpx_bench_row *row);
/** Prints a comment line: "# text" above the table, or to stderr in JSON
 *  mode (so stdout stays one object per line). */
void lpx_bench_report_note(lpx_bench_report *r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/** Prints the table (text mode), then the goal count line
 *  "lpx-bench-goals: <bench> met=N missed=M" (stdout in text mode, stderr
 *  in JSON mode; `make bench` sums them), and frees the rows. A goal is a
 *  performance target that a slower machine or a regression can miss;
 *  what follows from a format (bytes on the wire) is a property, stated in
 *  the note, never a goal. */
void lpx_bench_report_finish(lpx_bench_report *r);

/* ---- timing -------------------------------------------------------- */

/** A batch: runs the measured operation `iters` times; returns 0, or
 *  non-zero to abort the measurement (an error). */
typedef int (*lpx_bench_batch_fn)(void *ctx, int64_t iters);

typedef struct lpx_bench_opts {
    int reps;              /* timed batches (median over them); default 101 */
    double batch_ms;       /* target time of one batch; default 2 ms: short batches
                            * keep a preempted batch from moving the median on a
                            * busy machine */
    double warmup_ms;      /* untimed warm-up; default 50 ms */
} lpx_bench_opts;

typedef struct lpx_bench_stats {
    double median_ns;      /* ns per iteration, median over batches */
    double min_ns;
    double max_ns;
    int64_t batch;         /* iterations per batch */
    int reps;
} lpx_bench_stats;

/** Fills defaults into zero fields of o. */
void lpx_bench_opts_default(lpx_bench_opts *o);
/** Times fn: warm-up, calibrates the batch size so one batch takes about
 *  o->batch_ms, then o->reps timed batches. Returns fn's non-zero result
 *  if it failed (stats untouched), else 0. */
int lpx_bench_measure(lpx_bench_batch_fn fn, void *ctx, const lpx_bench_opts *o, lpx_bench_stats *out);

/** Median of n doubles (sorts v in place); NAN if n == 0. */
double lpx_bench_median(double *v, int n);

#endif
