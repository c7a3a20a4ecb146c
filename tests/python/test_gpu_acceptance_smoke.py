"""The GPU acceptance run's CPU smoke (issue 32; bench/gpu/acceptance.py,
docs/GPU.md "Acceptance run"): stages this build with
scripts/gpu-stage.sh into a scratch folder (no wheel: no network here),
runs `run-gpu.sh acceptance --smoke` from it, and checks that every
stage ran in its own process and said "no GPU", that the table has one
row for every target of the issue's list (the list below, written from
the issue, not from acceptance.py), each "not measured (no GPU)", that
the JSON under $OUT says the same, that the stages' CPU paths parsed what
they ran (lpx train's step lines, lpx plan's prediction, the first-step
and 50-step losses), and that naming stages reruns only those. Speed is
not asserted anywhere. Environment: LPX_TEST_BUILD (a build with
lpx-cuda.so), LPX_TEST_SOURCE_ROOT."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pycase import case, finish  # noqa: E402

BUILD = os.environ["LPX_TEST_BUILD"]
ROOT = os.environ["LPX_TEST_SOURCE_ROOT"]

# issue 32, "The stages and their targets": one row per target
TARGETS = [
    "suite.pass", "suite.cudnn", "suite.cublaslt_block", "suite.own_kernels",          # GPU suite
    "trainer.bf16_tokens", "trainer.bf16_memory",                                       # trainer, bf16
    "trainer.f8_tensorwise_vs_bf16", "trainer.f8_tensorwise_vs_torchao",                # trainer, fp8
    "trainer.f8_rowwise_vs_bf16", "trainer.f8_blockwise_vs_bf16", "trainer.nf4_qlora_runs",
    "losses.first_step", "losses.f8_50_steps",                                          # losses
    "attention.fwd_bwd_vs_sdpa",                                                        # attention
    "blockwise.gemm_8192", "blockwise.linear_4096x14336",                               # blockwise
    "lpxtorch.f8_vs_bf16", "lpxtorch.cuda_tests",                                       # lpx.torch
    "plan.bf16", "plan.f8_tensorwise", "plan.f8_rowwise",                               # lpx plan
    "kernels.rowwise_quantize", "kernels.nf4_dequantize",                               # kernels
    "kernels.adamw_state_8bit", "kernels.adamw_state_4bit", "kernels.adamw_state_fp8",  # optimizer states
    "delayed.on_device",                                                                # delayed scaling
]
STAGES = ["suite", "kernels", "blockwise", "attention", "delayed", "trainer", "plan", "trainer-ref", "losses",
          "lpxtorch"]

tmp = tempfile.mkdtemp(prefix="lpx-acc-smoke-")
stage = os.path.join(tmp, "stage")
env = dict(os.environ, PYTHON=sys.executable)
env.pop("OUT", None)
st = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-stage.sh"), "-B", BUILD, "-o", stage, "--no-build",
                     "--no-wheel"], capture_output=True, text=True, cwd=ROOT, timeout=120)


def accept(out, *args):
    e = dict(env, OUT=out)
    return subprocess.run(["bash", os.path.join(stage, "run-gpu.sh"), "acceptance", "--smoke"] + list(args),
                          capture_output=True, text=True, env=e, timeout=240)


full = accept(os.path.join(tmp, "out")) if st.returncode == 0 else None
doc = None
if full is not None:
    try:
        with open(os.path.join(tmp, "out", "acceptance", "acceptance.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        pass


@case
def test_stage_made():
    assert st.returncode == 0, "gpu-stage.sh failed:\n" + st.stdout + st.stderr
    for f in ("run-gpu.sh", "lpx", "lpx-cuda.so", "bench/acceptance.py", "bench/train_compare.py",
              "h200-measured.json", "lpx-commit.txt", "tests/test_cuda_delayed", "llama_tiny/config.json"):
        assert os.path.exists(os.path.join(stage, f)), f + " not staged"


@case
def test_smoke_table_has_every_target():
    assert full is not None and full.returncode == 0, (full.stdout + full.stderr)[-3000:] if full else "not run"
    out = full.stdout
    assert re.search(r"^target +\| measured +\| goal +\| met", out, re.M), out[-3000:]
    assert doc is not None, "no acceptance.json under $OUT/acceptance"
    ids = [r["id"] for r in doc["rows"]]
    missing = [t for t in TARGETS if t not in ids]
    assert not missing, "targets without a row: %s" % missing
    for r in doc["rows"]:
        assert r["measured"] == "not measured (no GPU)" and r["met"] == "-", r
        assert r["target"] in out, "row %s not printed" % r["id"]
    assert doc["header"]["smoke"] is True and "no GPU" in doc["header"]["chip"]


@case
def test_every_stage_ran_and_said_no_gpu():
    assert doc is not None
    for s in STAGES:
        assert doc["stages"][s]["state"] == "ran", (s, doc["stages"][s])
        assert doc["stages"][s]["limit_s"] > 0
        notes = " ".join(doc["results"][s]["notes"])
        assert "no GPU" in notes, (s, notes)
        assert os.path.exists(os.path.join(tmp, "out", "acceptance", "logs", s + ".log"))


@case
def test_cpu_paths_parsed():
    """What the smoke versions ran on the CPU was read back: the same
    parsers read the GPU run."""
    assert doc is not None
    R = doc["results"]
    for recipe in ("bf16", "float8-tensorwise", "float8-rowwise", "float8-blockwise", "nf4-qlora"):
        row = R["trainer"]["lpx"][recipe]
        assert row.get("tok_s") and row.get("ms_step"), (recipe, row)
    pred = R["plan"]["predicted_ms"]
    assert pred.get("bf16") and pred.get("float8-tensorwise") and pred.get("float8-rowwise"), pred
    assert R["plan"]["measured_ms"].get("bf16"), R["plan"]   # the trainer stage's CPU step, read back
    first = R["losses"]["first_step"]
    assert isinstance(first.get("lpx_loss"), float) and first["lpx_loss"] > 0, first
    loss = R["losses"]["fifty"].get("loss", {})
    assert len(loss) == 2 and "rel" in R["losses"]["fifty"], R["losses"]["fifty"]
    assert R["suite"].get("failed") == 0 and "passed" in R["suite"], R["suite"]


@case
def test_rerun_named_stages_only():
    out = os.path.join(tmp, "out-rerun")
    r = accept(out, "plan", "delayed")
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(out, "acceptance", "acceptance.json")) as f:
        d = json.load(f)
    ran = sorted(s for s, v in d["stages"].items() if v["state"] == "ran")
    assert ran == ["delayed", "plan"], d["stages"]
    assert d["stages"]["trainer"]["state"] == "not selected"
    bad = subprocess.run(["bash", os.path.join(stage, "run-gpu.sh"), "acceptance", "--smoke", "nosuchstage"],
                         capture_output=True, text=True, env=dict(env, OUT=out), timeout=120)
    assert bad.returncode == 2 and "nosuchstage" in bad.stderr, bad.stdout + bad.stderr


@case
def test_rows_judge_a_gpu_run():
    """The rows' GPU path on made-up results of every stage (the smoke
    never has numbers): each row measured, met or NOT met by its goal;
    a stage that timed out leaves its rows "not measured" naming it."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
    import acceptance as A
    lin = lambda ms, **k: dict({"ms": ms, "error": None}, **k)  # noqa: E731
    R = {
        "suite": {"passed": 120, "failed": 0, "skipped": 0,
                  "programs": {"cuda_attention": "PASS", "cuda_float8_block": "PASS", "cuda_coverage": "PASS",
                               "python_torch": "PASS"},
                  "attention_path": "fused SDPA (/x/libcudnn.so.9, cuDNN 9.10)", "block_path": "cuBLASLt",
                  "block_used": 6, "coverage": [70, 70], "torch_cuda_cases": {"test_cuda_layers_match_cpu": "pass"}},
        "kernels": {"lpx": {"copy": {"gbps": 4000.0}, "fp8_quant_rowwise": {"gbps": 3000.0},
                            "nf4_dequant": {"gbps": 3500.0}, "adamw_state_8bit": {"gbps": 3300.0},
                            "adamw_state_4bit": {"gbps": 3100.0}, "adamw_state_fp8": {"error": "boom8"}}},
        "blockwise": {"lpx": {"gemm_bf16": lin(1.6), "gemm_fp8_blockwise": lin(0.9, path="x on cuBLASLt: 3; y"),
                              "float8_linear_bf16_4096x14336": lin(4.1),
                              "float8_linear_blockwise_4096x14336": lin(3.0, path="x on cuBLASLt: 3; y")}},
        "attention": {"lpx": {"attention_llama3": lin(2.0, path="attention calls on cuDNN: 240; fused SDPA"),
                              "attention_llama3_fwd": lin(0.6)},
                      "torch": {"attention_llama3": lin(1.8), "attention_llama3_fwd": lin(0.55)}},
        "delayed": {"steps": 8, "moved": 5, "equal": True, "rc": 0},
        "trainer": {"lpx": {"bf16": {"tok_s": 33000.0, "ms_step": 248.0, "peak_gib": 50.0},
                            "float8-tensorwise": {"tok_s": 43000.0, "ms_step": 190.0},
                            "float8-rowwise": {"tok_s": 38000.0, "ms_step": 215.0},
                            "float8-blockwise": {"skipped": "exit 1: boom"},
                            "nf4-qlora": {"tok_s": 20000.0, "ms_step": 400.0}}},
        "trainer-ref": {"torch": {"compile": {"tokens_per_s": 34000.0, "peak_gib": 45.0},
                                  "f8-tensorwise": {"tokens_per_s": 45000.0}}},
        "plan": {"predicted_ms": {"bf16": 240.0, "float8-tensorwise": 170.0, "float8-rowwise": 160.0},
                 "measured_ms": {"bf16": 248.0, "float8-tensorwise": 190.0, "float8-rowwise": 215.0}},
        "losses": {"first_step": {"lpx_loss": 11.7701, "ref_loss": 11.7702, "rel": 0.1 / 117702},
                   "fifty": {"loss": {"float8-tensorwise": 5.01, "bf16": 5.0}, "rel": 0.002}},
        "lpxtorch": {"torch": {"eager": {"tokens_per_s": 32000.0}, "lpx-f8-tensorwise": {"tokens_per_s": 43000.0}}},
    }
    status = {s: {"state": "ran"} for s in STAGES}
    rows = {r["id"]: r for r in A.build_rows(R, status, True)}
    assert sorted(rows) == sorted(TARGETS), sorted(set(rows) ^ set(TARGETS))
    want = {"suite.pass": "yes", "suite.cudnn": "yes", "suite.cublaslt_block": "yes", "suite.own_kernels": "yes",
            "trainer.bf16_tokens": "yes", "trainer.bf16_memory": "NO", "trainer.f8_tensorwise_vs_bf16": "yes",
            "trainer.f8_tensorwise_vs_torchao": "NO", "trainer.f8_rowwise_vs_bf16": "yes",
            "trainer.f8_blockwise_vs_bf16": "NO", "trainer.nf4_qlora_runs": "yes", "losses.first_step": "yes",
            "losses.f8_50_steps": "yes", "attention.fwd_bwd_vs_sdpa": "yes", "blockwise.gemm_8192": "yes",
            "blockwise.linear_4096x14336": "yes", "lpxtorch.f8_vs_bf16": "yes", "lpxtorch.cuda_tests": "yes",
            "plan.bf16": "yes", "plan.f8_tensorwise": "NO", "plan.f8_rowwise": "NO",
            "kernels.rowwise_quantize": "NO", "kernels.nf4_dequantize": "yes",
            "kernels.adamw_state_8bit": "yes", "kernels.adamw_state_4bit": "NO", "kernels.adamw_state_fp8": "NO",
            "delayed.on_device": "yes" if A.DELAYED_UPDATE_ON_DEVICE else "NO"}
    got = {k: r["met"] for k, r in rows.items()}
    assert got == want, {k: (got[k], want[k], rows[k]["measured"]) for k in want if got[k] != want[k]}
    assert "boom" in rows["trainer.f8_blockwise_vs_bf16"]["measured"]
    assert "boom8" in rows["kernels.adamw_state_fp8"]["measured"]
    # the trainer stage timed out before its rows: they name it, not judged
    status["trainer"] = {"state": "timed out", "why": "timed out after 150 s"}
    R2 = dict(R, trainer={"lpx": {}})
    rows = {r["id"]: r for r in A.build_rows(R2, status, True)}
    assert rows["trainer.f8_rowwise_vs_bf16"]["met"] == "-", rows["trainer.f8_rowwise_vs_bf16"]
    assert "stage trainer timed out" in rows["trainer.f8_rowwise_vs_bf16"]["measured"]
    # rows whose numbers are there are judged (the plan stage read an earlier trainer result)
    assert rows["plan.bf16"]["met"] == "yes" and rows["suite.pass"]["met"] == "yes"


if full is not None and full.returncode == 0 and os.environ.get("LPX_TEST_KEEP") != "1":
    shutil.rmtree(tmp, ignore_errors=True)
elif full is not None:
    print("(kept %s)" % tmp)
finish()
