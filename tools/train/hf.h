/* Hugging Face Llama checkpoints (hf_read.c reads, hf_write.c writes):
 * config.json and safetensors in transformers' names, read into and
 * written from lpx train's model. */
#ifndef LPX_TRAIN_HF_H
#define LPX_TRAIN_HF_H

#include "train.h"

/* Hugging Face's name of parameter P (model.layers.N.self_attn.q_proj.weight, ...) */
void tr_hf_name(const tr_param *P, char *buf, size_t n);
/* The model DIR/config.json describes (transformers 4.x or 5.x keys).
 * Errors: LPX_ENOTFOUND (no config.json), LPX_EINVAL (not a Llama, a
 * setting lpx's Llama does not have), LPX_EIO. The caller still runs
 * tr_arch_check on the result. */
lpx_status tr_hf_config(const char *dir, tr_arch *a);
/* Every parameter of g from DIR's safetensors (one file or an index and
 * its shards) as f32 into w[p] (w NULL: every name, shape and dtype
 * checked, nothing read). Errors: LPX_ENOTFOUND (a missing shard),
 * LPX_EINVAL (a missing tensor, a wrong shape or dtype, a tensor that is
 * not a parameter of g), LPX_EIO, LPX_ENOMEM. */
lpx_status tr_hf_load(const char *dir, const tr_geom *g, float **w);
/* --save-hf: DIR created (mkdir -p) before the run; every rank writes its
 * rows of DIR/model.safetensors (f32, transformers' names) with
 * lpx_fsdp_export, no gather; then (tr_hf_write_config) the files of the
 * --init folder `init` (NULL: none) that are not weights nor config.json
 * are copied (tr_hf_check_copy), then config.json, atomically: its presence
 * means the model is complete. It is init's config.json object with only
 * the dtype set to float32 and quantization_config dropped (every other
 * field as it was read), or without init the one lpx writes from g. Then
 * an earlier sharded model's index and the shards it names are removed,
 * regular files only, nothing else of DIR. */
lpx_status tr_hf_make_dir(const char *dir);
struct tr_rank;
lpx_status tr_hf_export(struct tr_rank *R, const char *dir);
lpx_status tr_hf_write_config(const char *dir, const tr_geom *g, const char *init);
/* Before the run: the files of --init folder `init` that --save-hf copies
 * into `out` (every regular file but hidden ones, config.json and weights:
 * *.safetensors, *.bin, *.pt, *.pth, *.ckpt, *.h5, *.msgpack, *.gguf,
 * *.onnx, *.index.json; no subfolder; a symbolic link only to a file
 * inside the folder, or in the blobs/ of a Hugging Face cache snapshot)
 * can be: each out/NAME is absent, the same file or the same bytes. A
 * different file is LPX_EEXIST naming both (lpx never overwrites it), a
 * FIFO or folder there LPX_EINVAL. Each file not copied for a reason the
 * user may not expect (a link out of the folder, a FIFO) gets one warning
 * line on `warn` (NULL: none). */
lpx_status tr_hf_check_copy(const char *init, const char *out, FILE *warn);
/* --init DIR (Hugging Face), every recipe with dense masters: after setup,
 * every rank reads its own rows of every weight (lpx_fsdp_import; the files
 * memory-mapped, so no rank reads the model). */
lpx_status tr_hf_import(struct tr_rank *R, const char *dir);

/* nf4-qlora's base after its bf16 pre-training: the whole model w (f32,
 * host) as a Hugging Face folder DIR (created, mkdir -p): model.safetensors
 * in transformers' names, then config.json (tr_hf_write_config, no init),
 * each atomically; `--init DIR` reads it back like any Hugging Face model */
lpx_status tr_hf_save(const char *dir, const tr_geom *g, float *const *w);
/* The Hugging Face name of group gr's parameter i (ctx: the tr_rank), for
 * lpx_fsdp_export and lpx_fsdp_import */
struct lpx_fsdp_group;
bool tr_hf_group_name(void *ctx, struct lpx_fsdp_group *gr, int i, char *buf, size_t len);

#endif
