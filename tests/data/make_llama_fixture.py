#!/usr/bin/env python3
"""Makes tests/data/llama_tiny/: a small random Llama 3 checkpoint written by
transformers, with the logits, the loss and one step's gradients it computes
for a fixed token sequence. tests/test_llama.c checks lpx against them.

Run once by hand (transformers is not a dependency of the build or of CI):
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors
    /tmp/hf/bin/python tests/data/make_llama_fixture.py tests/data/llama_tiny

The model has what lpx must reproduce: grouped-query attention (4 query
heads, 2 key/value heads), rope_theta 500000 with Llama 3.1's "llama3" rope
scaling (original_max_position_embeddings 64, so the 8 frequencies of head
dim 16 fall in all three of its bands: kept, smoothed and divided), an
untied head, SwiGLU with its own intermediate_size, RMSNorm weights that are
not ones. Weights are rounded to bf16 and saved in bf16 (the dtype real
checkpoints ship in, and half the bytes), then computed with in f32; the
checkpoint is sharded (model.safetensors.index.json and two shards), as
large models are."""
import json
import os
import struct
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/llama_tiny"
os.makedirs(out, exist_ok=True)
torch.manual_seed(1234)

rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}
kw = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False,
          attention_bias=False, mlp_bias=False, hidden_act="silu")
if int(transformers.__version__.split(".")[0]) >= 5:
    cfg = LlamaConfig(rope_parameters=dict(rope, rope_theta=500000.0), **kw)
else:
    cfg = LlamaConfig(rope_theta=500000.0, rope_scaling=rope, **kw)
cfg._attn_implementation = "eager"
model = LlamaForCausalLM(cfg).float().eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            v = 1.0 + 0.2 * torch.randn_like(p)
        else:
            v = torch.randn_like(p) * (0.5 if "embed" in name else 1.0 / p.shape[1] ** 0.5)
        p.copy_(v.bfloat16().float())   # values exact in bf16

ids = torch.randint(0, cfg.vocab_size, (1, 24))
out_ = model(input_ids=ids, labels=ids)
out_.loss.backward()
# before the bf16 copy below: Module.to converts the .grad tensors too
grads = {n: p.grad.detach().float().clone().contiguous() for n, p in model.named_parameters()}

model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, max_shard_size="100KB")
for extra in ("generation_config.json",):
    if os.path.exists(os.path.join(out, extra)):
        os.remove(os.path.join(out, extra))
with open(os.path.join(out, "tokens.bin"), "wb") as f:
    f.write(struct.pack("<%dI" % ids.shape[1], *ids[0].tolist()))
save_file({"logits": out_.logits[0].detach().float().contiguous()}, os.path.join(out, "logits.safetensors"))
save_file(grads, os.path.join(out, "grads.safetensors"))
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump({"loss": out_.loss.item(), "torch": torch.__version__, "transformers": transformers.__version__,
               "tokens": ids[0].tolist()}, f, indent=1)
print("wrote", out, "loss", out_.loss.item())
