/* Internal to the sharded checkpoint (fsdp_checkpoint.c: save and load,
 * fsdp_ckpt_reader.c: lpx_fsdp_ckpt_*, fsdp_export.c: the consolidated
 * export); fsdp_ckpt_common.c holds what they share. Layout and commit:
 * fsdp_checkpoint.c's header comment and docs/CHECKPOINT.md. */
#ifndef LPX_FSDP_CKPT_INTERNAL_H
#define LPX_FSDP_CKPT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "lpx/lpx.h"
#include "lpx/checkpoint.h"
#include "core/lpx_internal.h"

#define CK_FORMAT "lpx-fsdp-checkpoint"
#define CK_VERSION 1
#define CK_PATH 4096
/* extra tensors live in their rank's file under this prefix */
#define CK_EXTRA "extra/"

typedef struct ck_file {
    uint64_t bytes, fnv;
} ck_file;

/* a parameter's key: "<group>/<i>/<name>" (the same model built again
 * has the same keys) */
void ck_key(const lpx_fsdp_group *g, int i, char *buf, size_t len);
/* "<dir>/rank-RRRRR-of-WWWWW.safetensors" (callers keep dir below
 * CK_PATH - 64 bytes, so nothing is cut) */
void ck_rank_file(char *buf, size_t len, const char *dir, int rank, int world);
/* size and FNV-1a 64 (8-byte words, then the tail bytes) of a file */
lpx_status ck_fnv_of_file(const char *path, ck_file *out);
/* The index's self-checksum: FNV-1a 64 over bytes, and the 16 digits of
 * its one "checksum" field in text (NULL: none, or more than one). */
uint64_t ck_fnv_text(const char *p, size_t n);
char *ck_sum_digits(char *text);
/* Every rank learns whether every rank succeeded: the lowest failing
 * rank's status everywhere; allocates nothing (see the definition). */
lpx_status ck_agree(lpx_comm *comm, const char *what, lpx_status mine);
/* Where this rank stands: the shard comm (mesh dim 1 of a 2-D mesh, the
 * comm of a 1-D one), its rank and size there, and on a 2-D mesh the
 * replica comm (dim 0) and this rank's replica. Replica 0 writes; every
 * replica reads. */
typedef struct ck_mesh {
    lpx_comm *shard, *replica;   /* replica: NULL on a 1-D mesh */
    int rank, world, replica_rank;
} ck_mesh;
/* f is sharded, every group resharded; its mesh as a ck_mesh */
lpx_status ck_check_engine(const char *op, lpx_fsdp *f, ck_mesh *m);
/* ck_agree over the whole mesh: the shard comm, then the replica comm */
lpx_status ck_agree_all(const ck_mesh *m, const char *what, lpx_status mine);

typedef struct ck_index {
    cJSON *root;
    int world;
    cJSON *files, *params;
    cJSON *extras;          /* [[name, rank], ...] or NULL */
    char dir[CK_PATH];      /* the directory read (<dir>.old after an interrupted commit) */
    int dirfd;              /* that directory, open and share-locked while the index is held (-1: none) */
    uint64_t sum;           /* the index's checksum: which checkpoint this is */
} ck_index;
/* Reads and validates <dir>/index.json (or <dir>.old's) under a shared
 * lock on the directory (ck_lock_shared), held until ck_index_free: a
 * save cannot replace the directory while it is read. */
lpx_status ck_read_index(const char *op, const char *dir, ck_index *ix);
/* Frees the index and releases its lock (a zeroed or failed one too). */
void ck_index_free(ck_index *ix);

/* ---- the paths a save may touch (fsdp_ckpt_paths.c) ---- */

/* The folder part of path into buf ("." when none, "/" for "/x"); also
 * lpx_output_path's (output_path.c) */
void ck_parent_of(const char *path, char *buf, size_t len);

/* dir without its trailing slashes into buf ("ck/" and "ck" name one
 * checkpoint; "ck/.tmp" would be inside it); EINVAL if too long or empty */
lpx_status ck_norm_dir(const char *op, const char *dir, char *buf, size_t len);
/* A name lpx_fsdp_save writes into a checkpoint directory: index.json,
 * index.json.tmp, rank-RRRRR-of-WWWWW.safetensors and its temporaries
 * (".tmp.XXXXXX"); with world > 0, a rank file must be of that world. */
bool ck_own_name(const char *name, int world);
/* Nothing is touched. ok when the save can commit to dir: dir absent (its
 * parent a writable directory), an empty directory, or a whole lpx
 * checkpoint (a valid index naming every file in it, each a regular file);
 * <dir>.tmp and <dir>.old absent or holding only names a save writes.
 * A symbolic link is refused at each of the three paths. */
lpx_status ck_check_target(const char *op, const char *dir);
/* Removes a directory a save made (or a checkpoint ck_check_target
 * accepted): only the entries ck_own_name accepts (unlinkat: a link is
 * removed, never followed), then the directory; a missing one is fine,
 * a foreign entry an error that removes nothing. */
lpx_status ck_remove_own_dir(const char *op, const char *dir);
/* flock(LOCK_SH or LOCK_EX) of an open directory, waiting up to
 * timeout_ms: 1 taken, 0 timed out, -1 the file system has no locks (then
 * nothing is held and the caller goes on unlocked, as before locks). */
int ck_flock_wait(int fd, int how, int timeout_ms);
/* how long a save waits for readers of the directory it replaces, and a
 * reader for a save's commit */
#define CK_SAVE_WAIT_MS 60000
#define CK_READ_WAIT_MS 60000

/* Every rank of the mesh read the index with checksum sum (a save that
 * committed between two ranks' reads would mix two checkpoints): mine,
 * or EIO naming dir where they differ; a comm failure as is. Collective. */
lpx_status ck_agree_index(const ck_mesh *m, const char *op, const char *dir, lpx_status mine, uint64_t sum);

typedef struct ck_open {
    lpx_safetensors **f;   /* per saved rank, opened on first use */
    const ck_index *ix;
    bool verify;           /* check each file's checksum when opening it */
} ck_open;
/* saved rank r's file: its size (and checksum where o->verify) checked
 * against the index, mapped once */
lpx_status ck_open_rank(const char *op, ck_open *o, int r, lpx_safetensors **out);

#endif
