/* Files lpx train and lpx eval write at paths the user names (metrics.csv,
 * loss.svg; the safetensors outputs go through
 * lpx_safetensors_save, which resolves paths the same way). */
#ifndef LPX_TOOLS_TRAIN_OUTFILE_H
#define LPX_TOOLS_TRAIN_OUTFILE_H

#include <stdio.h>
#include "lpx/lpx.h"

/* A whole file being written: a fresh temporary (mkstemp) in the folder
 * of the resolved destination, renamed over it by tr_outfile_commit. */
typedef struct tr_outfile {
    FILE *f;
    char final[4096];   /* the destination, links followed (lpx_output_path) */
    char tmp[4200];
} tr_outfile;

/* Resolves path (a link's target; a FIFO, device or directory refused,
 * naming `what`) and opens the temporary. */
lpx_status tr_outfile_open(const char *what, const char *path, tr_outfile *o);
/* Flushes, fsyncs, closes and renames; on any failure the temporary is
 * removed and the destination is what it was. */
lpx_status tr_outfile_commit(tr_outfile *o);
/* Closes and removes the temporary: the destination is what it was. */
void tr_outfile_abort(tr_outfile *o);

/* Before the first step: option `opt`'s directory can receive the files
 * `names` (n of them): it is a directory (or absent, with a writable
 * parent: made later), and each DIR/NAME is absent, a file, or a link to
 * one (lpx_output_path). One-line error naming opt. */
lpx_status tr_check_out_dir(const char *opt, const char *dir, const char *const *names, int n);

/* The input that `out` (an existing output path) is: the file `file`, or
 * a file of the folder `dir` (either may be NULL); NULL when none. Compared
 * by device and inode, so links and other spellings count. The returned
 * name is `file` or a static buffer. */
const char *tr_same_file_in(const char *out, const char *file, const char *dir);

/* Two folder options naming one directory that cannot hold both: the
 * checkpoint (--save, only its own files) with --out or --save-hf, and
 * --save-hf into the --init folder (it replaces that model's files). One
 * line naming both, or LPX_OK. */
lpx_status tr_check_output_clash(const char *save, const char *out, const char *save_hf, const char *init);

#endif
