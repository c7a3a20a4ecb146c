/* Helpers shared by the contracts: the kind's declared parameters with the
 * kit's defaults, test data, comparisons. */
#ifndef LPX_CF_UTIL_H
#define LPX_CF_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include "conformance.h"

/* What a kind declares, defaults filled in (see lpx_kind_conformance). */
typedef struct cf_params {
    int ndim;
    int64_t shape[4];
    double max_err, min_sqnr_db, op_rtol, op_atol;
    const char *all_gather_kind;          /* NULL: post_all_gather returns this kind */
    const lpx_conformance_na *not_applicable;
    const lpx_conformance_variant *variants;
} cf_params;

/* The variant the running case checks (set by cf_run; each case runs in
 * a process of its own), NULL for the kind's own form. */
extern const lpx_conformance_variant *cf_variant;
/* from_dense of the running case's form: the variant's, else the kind's
 * (lpx_kind_from_dense). */
lpx_status cf_from_dense(const lpx_kind *k, lpx_tensor *x, lpx_tensor **out);

void cf_params_of(const lpx_kind *k, cf_params *p);

/* Distributions the quantize contract draws. */
enum { CF_DIST_NORMAL, CF_DIST_UNIFORM, CF_DIST_HEAVY, CF_DIST_OUTLIERS, CF_DIST_TINY, CF_DIST_LARGE,
       CF_DIST_ZEROS, CF_DIST_CONSTANT, CF_DIST_COUNT };
const char *cf_dist_name(int d);
/* New dense f32 tensor of the declared shape drawn from distribution d. */
lpx_status cf_data(const cf_params *p, int d, uint64_t seed, lpx_tensor **out);

/* Writes a printf-style detail into (buf, len) and returns `o`. */
cf_outcome cf_say(cf_outcome o, char *buf, size_t len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Fails with the lpx error of a call that should have worked. */
cf_outcome cf_lpx_fail(char *buf, size_t len, const char *what, lpx_status st);

/* to_dense through the kind (dense: cast to f32), contiguous. */
lpx_status cf_dense(lpx_tensor *t, lpx_tensor **out);
/* True if a and b have the same shape; writes both shapes into sa/sb. */
bool cf_same_shape(const lpx_tensor *a, const lpx_tensor *b, char *sa, char *sb, size_t len);
/* max |a - b| over contiguous f32 tensors of equal numel; NaN in one but
 * not the other counts as infinite. Also max |b| through *bmax. */
double cf_max_diff(const lpx_tensor *a, const lpx_tensor *b, double *bmax);
/* SQNR of y against x in dB (inf when y == x). */
double cf_sqnr_db(const lpx_tensor *x, const lpx_tensor *y);

/* Shard unit of t (1 when the kind has no shard_unit). */
int64_t cf_shard_unit(const lpx_tensor *t);

#endif
