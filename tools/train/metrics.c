/* metrics.csv and loss.svg. Both are written to a fresh temporary beside
 * DIR/NAME (outfile.c: a link's target is replaced, a FIFO refused),
 * flushed, fsync'd and renamed over it: readers see a complete file or none.
 * The CSV ends with a "# complete" line as a second guard for tools that
 * copy files without renaming. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "metrics.h"
#include "outfile.h"

static lpx_status write_csv(const char *dir, const tr_result *res, int nres)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    tr_outfile o;
    lpx_status st = tr_outfile_open("--out", path, &o);
    if (st != LPX_OK) return st;
    FILE *f = o.f;
    fprintf(f, "recipe,step,train_loss,val_loss,tokens_per_s,compute_ms,comm_ms\n");
    for (int r = 0; r < nres; r++) {
        const tr_result *R = &res[r];
        for (int s = 0; s < R->steps; s++) {
            const tr_step_rec *x = &R->rec[s];
            fprintf(f, "%s,%d,%.6f,", R->label, s + 1, x->loss);
            if (s == R->steps - 1) fprintf(f, "%.6f", R->val_loss);
            fprintf(f, ",%.1f,%.3f,%.3f\n", x->tok_s, x->compute_ms, x->comm_ms);
        }
    }
    fprintf(f, "# complete\n");
    return tr_outfile_commit(&o);
}

/* A hand-written SVG: one polyline per recipe (a moving average over 5
 * steps so the curves stay readable), axes with ticks and labels. */
static lpx_status write_svg(const char *dir, const tr_result *res, int nres)
{
    static const char *const colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
    const double W = 720, H = 440, L = 70, Rm = 180, T = 40, B = 60;
    int maxs = 1;
    double lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < nres; r++) {
        if (res[r].steps > maxs) maxs = res[r].steps;
        for (int s = 0; s < res[r].steps; s++) {
            double v = res[r].rec[s].loss;
            if (isfinite(v)) {
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
        }
    }
    if (!(hi > lo)) {
        lo = 0;
        hi = 1;
    }
    lo = floor(lo * 2) / 2;
    hi = ceil(hi * 2) / 2;
    char path[1200];
    snprintf(path, sizeof path, "%s/loss.svg", dir);
    tr_outfile o;
    lpx_status st = tr_outfile_open("--out", path, &o);
    if (st != LPX_OK) return st;
    FILE *f = o.f;
    double pw = W - L - Rm, ph = H - T - B;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W, H, W, H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">lpx train: training loss per "
               "step</text>\n", L + pw / 2);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", L, T,
            pw, ph);
    for (int i = 0; i <= 5; i++) {
        double v = lo + (hi - lo) * i / 5, y = T + ph - ph * i / 5;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, L + pw, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, y + 4, v);
        double sx = L + pw * i / 5;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", sx, T + ph + 18,
                (int)lround((double)maxs * i / 5));
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">optimizer step</text>\n", L + pw / 2, H - 18);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">cross-entropy "
               "(nats/char)</text>\n", T + ph / 2, T + ph / 2);
    for (int r = 0; r < nres; r++) {
        const char *c = colors[r % 6];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"", c);
        for (int s = 0; s < res[r].steps; s++) {
            double acc = 0;
            int k = 0;
            for (int j = s - 4 < 0 ? 0 : s - 4; j <= s; j++, k++) acc += res[r].rec[j].loss;
            double v = acc / k;
            if (!isfinite(v)) continue;
            double x = L + pw * (s + 1) / maxs, y = T + ph - ph * (v - lo) / (hi - lo);
            fprintf(f, "%.1f,%.1f ", x, y < T ? T : (y > T + ph ? T + ph : y));
        }
        fprintf(f, "\"/>\n");
        double ly = T + 14 + 34.0 * r;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                L + pw + 12, ly, L + pw + 36, ly, c);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", L + pw + 42, ly + 4, res[r].label);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">val %.4f</text>\n", L + pw + 42, ly + 18,
                res[r].val_loss);
    }
    fprintf(f, "</svg>\n");
    return tr_outfile_commit(&o);
}

lpx_status tr_write_metrics(const char *dir, const tr_result *res, int nres)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return lpx_error(LPX_EIO, "cannot create '%s': %s", dir, strerror(errno));
    lpx_status st = write_csv(dir, res, nres);
    if (st == LPX_OK) st = write_svg(dir, res, nres);
    return st;
}
