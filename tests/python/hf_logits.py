"""The Hugging Face folder `lpx train --save-hf` wrote, as transformers loads it.

usage: hf_logits.py DIR TOKENS LOGITS [EOS]

Loads DIR with AutoModelForCausalLM (f32) and GenerationConfig, runs the
forward on TOKENS (little-endian u32 ids, as `lpx eval --tokens` reads
them) and compares the logits with LOGITS (the tensor 'logits' that `lpx
eval --logits` wrote for the same folder): max |transformers - lpx| must
be within 1e-5 of max |logit| (the bound of tests/test_llama.c). EOS: the
eos_token_id the generation config must give (a JSON value). Exit 0 on
success, 1 on a mismatch, 77 when torch or transformers is missing."""
import json
import sys

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file
except ImportError as e:  # the test skips with the reason
    print(f"skip: {e}")
    sys.exit(77)

d, tokens, logits_path = sys.argv[1:4]
ids = np.fromfile(tokens, dtype="<u4").astype(np.int64)
model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
model.eval()
with torch.no_grad():
    got = model(torch.from_numpy(ids)[None]).logits[0].numpy()
want = load_file(logits_path)["logits"]
err = float(np.abs(got - want).max()) / float(np.abs(want).max())
print(f"transformers {transformers.__version__}: logits [{got.shape[0]}, {got.shape[1]}], "
      f"max |transformers - lpx| / max |logit| = {err:.2e}")
ok = got.shape == want.shape and err <= 1e-5
if len(sys.argv) > 4:
    gen = transformers.GenerationConfig.from_pretrained(d)
    eos = json.loads(sys.argv[4])
    print(f"generation_config eos_token_id {gen.eos_token_id!r}, config max_position_embeddings "
          f"{model.config.max_position_embeddings}")
    ok = ok and gen.eos_token_id == eos
sys.exit(0 if ok else 1)
