#!/usr/bin/env bash
# Everything a lent NVIDIA GPU machine should run, in one or two device calls (see /work/.library/device):
#
#   run(command="bash tools/gpu_session.sh", timeout_s=600)   # cuda_tests, matmul_gpu, models_3xtf32, models, profile
#   run(command="bash tools/gpu_session.sh cuda_tests ops_f32")     # stages by name
#   (matmul_gpu: the example and the templates, SIMT f32, TF32 and 3xTF32, against cuBLAS, the
#   linears on 3xTF32 and SIMT against cuBLAS f32, and the wgmma example on TF32; models_3xtf32: the
#   transformers and ResNet-50 at batch 8 compiled with fp32_precision="3xtf32"; on request:
#   ops_f32, ops_f16, models_tuned — the models with TASKMAP_TUNE=topk —, models_tf32 — matmuls on
#   TF32 for every side —, models_f16 — the models in f16 —, models_bf16 — in bf16 —, models_tf32_mma, models_3xtf32_mma and
#   models_f16_mma — the same with TASKMAP_WGMMA=0 (mma.sync instead of sm_90a's wgmma, the A/B) —,
#   wgmma_sweep — every schedule of the wgmma template's space on BERT's linears, dumped to
#   $OUT/wgmma_sweep.json to fit its cost model —, models_tf32_tma, models_f16_tma,
#   models_3xtf32_tma and wgmma_tma_sweep — the same with TASKMAP_WGMMA=tma (the template's TMA
#   form) —, gpu_exhaustive — the GPU matmul cost model against exhaustive tuning —
#   and generate — transformers' generate under the backend against eager and inductor)
#   The default stages' limits add up to more than one call's 600 s (session 17's times plus the
#   3xTF32 stage: ~550 s); to be safe, split them: "cuda_tests matmul_gpu models_3xtf32", then
#   "models profile".
#   models_tuned also exports the measured choices to $OUT/records/<device>.json: commit them under
#   taskmap/schedule/records/ and every later compile on that kind of GPU uses them.
#   MODELS="resnet50 bert" TESTS="tests/backends" bash tools/gpu_session.sh cuda_tests models
#
# Session 27 (H200) ran the wgmma template for the first time and turned it on: "cuda_tests
# matmul_gpu" 100 s, each models_* stage at batch 8 for four models 60-80 s, wgmma_sweep on two
# shapes 60 s, a fresh machine's start ~30 s.  Next (offline work of session 27 not yet run on a
# GPU: two test fixes, the wgmma cost model's new picks, GPT-2's K x N weights transposed for
# wgmma, concatenations at batch > 1 written in place): "cuda_tests matmul_gpu", then
# TF32_BATCH=8 "models_tf32 models_f16 models_3xtf32" (GPT-2 against session 27's 3.1 / 2.0 /
# 6.5 ms), then "models" (the six at batch 1 and 8, default f32) and a wider wgmma_sweep.
#
# Session 28 (no GPU) wrote the TMA form of the wgmma template (tiles by the copy engine, a
# producer warp, mbarriers; TASKMAP_WGMMA=tma) and the tma_load / mbarrier primitives, checked in
# emulation and by ptxas only.  First: "cuda_tests matmul_gpu" (tests/backends/test_tma.py and
# tests/templates/test_matmul_wgmma_tma.py run the primitives and every TMA schedule on the GPU;
# matmul_gpu's TF32 / f16 and 3xTF32 tables gain the TMA form's columns), then
# "models_3xtf32_tma models_3xtf32" (the f32 bar: 3xTF32 against torch.compile f32 at batch 8),
# "models_tf32_tma models_f16_tma" against "models_tf32 models_f16" (TF32_BATCH=8), then
# wgmma_tma_sweep to fit the form's cost (its compute efficiency is a guess: 0.8 against the
# cp.async form's 0.55-0.6).  If it wins, make it the default (matmul_wgmma.tma_enabled).
#
# Session 29 (no GPU) made bfloat16 models compile (constants as ml_dtypes arrays, on the GPU
# uploaded as they are for the tensor-core templates): "cuda_tests" now runs
# tests/models/test_gpu_models.py::test_model_bf16 too, and "models_bf16" times the four models at
# batch 8 in bf16 against eager and torch.compile.
#
# Session 36 (no GPU) changed index code that GPU kernels share: the statement simplifier
# simplifies each branch of a select between two values under its condition (a fused
# concatenation's loads lose their clamps; guards against a constant keep them, for cp_async's
# zero fill), and fused definitions' inputs are one parameter by name.  Checked in emulation and by
# NVRTC only: run "cuda_tests" first.
#
# Session 41 (no GPU) changed the partition for every target: a view op (slice, reshape, permute,
# expand) whose readers are all in one injective group or prologue joins it, recomputed per
# reader (Swin's patch merging, GPT-NeoX's rotary slices: fewer kernels).  The GPU kernels of such
# groups were checked in emulation only (tests/graph/test_gpu_lowering.py): "cuda_tests models"
# covers them on a GPU.
#
# Session 42 (no GPU) added the SIGMOID and SILU intrinsics (CUDA / HIP: 1 / (1 + expf(-x)),
# x / (1 + expf(-x))) and the pointwise_as_linear graph pass (a 1x1 conv of a 1x1 image is a
# LINEAR: squeeze-and-excitation); NVRTC builds the sources here, nothing ran them on a GPU:
# "cuda_tests models" covers both.
#
# Session 43 (no GPU) taught the expression simplifier (x // y) * y + x % y -> x for a size y
# (not only a constant), which changes the index code of every kernel with symbolic sizes, GPU
# ones included; checked by the property tests and NVRTC builds only: "cuda_tests" first.
#
# Session 44 (no GPU) changed CPU cost models and the CPU pixel kernel only: nothing for a GPU.
#
# Session 45 (no GPU) gave the prefetch primitive a fourth argument (beside: what a fused epilogue
# reads beside the element; the CUDA backend renders it as nothing, no GPU template issues one) and
# the rule-based scheduler a CPU-only short-row reduction: "cuda_tests" covers the first.
#
# Session 46 (no GPU) changed the CPU matmul kernel's thin tiles and CPU cost models only: nothing
# for a GPU.
#
# Session 47 (no GPU) changed the CPU-only pointwise + depthwise kernel: nothing for a GPU.
#
# Session 13 (H200): the CUDA tests took 49 s, the six models at batch 1 and 8 with eager and
# torch.compile 227 s, the profile of two models ~50 s, a fresh machine's start ~30 s: the
# defaults fit one 15-minute lease with room for one more call.  Session 17 (H200): tests 58 s,
# models 276 s, the profile of three models 35 s, matmul_gpu 7 s (before its A/B table), tuning
# BERT + ResNet-50 at batch 1 ~120 s, BERT at batch 8 ~70 s; one call's overhead ~30 s.
#
# The machine's image has torch (CUDA 13), cuda-bindings 13 and NVRTC 13 (taskmap finds their
# headers under nvidia/cu13), hypothesis, pytest-xdist, networkx, tqdm and transformers, and no
# internet: taskmap runs from the working tree (PYTHONPATH); only its entry points are installed.
# Logs land in $OUT (they come back); each stage is time-boxed so that later stages still run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/taskmap-gpu}"
mkdir -p "$OUT"
# taskmap's entry points as an install would declare them (torch.compile(backend="taskmap") finds
# the backend through one), from pyproject.toml, in a dist-info folder on the path
python3 - <<'PY'
import pathlib, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path("/tmp/taskmap-entry-points/taskmap-0.dist-info")
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: taskmap\nVersion: {project.get('version', '0')}\n")
(info / "entry_points.txt").write_text("".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
                                               for group, points in project["entry-points"].items()))
PY
export PYTHONPATH="$PWD:/tmp/taskmap-entry-points${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WANT=" ${*:-cuda_tests matmul_gpu models_3xtf32 models profile} "     # the others on request
stage() {  # stage NAME SECONDS COMMAND...  (only the stages named on the command line, if any)
    local name=$1 limit=$2; shift 2
    [[ "$WANT" == *" $name "* ]] || return 0
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "=== $name: exit $?"; tail -n 25 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, cuda.bindings; print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__)" | tee -a "$OUT/gpu.txt"
stage cuda_tests ${TEST_SECONDS:-150} python3 -m pytest -m cuda -q -p no:cacheprovider --no-header -rfE --tb=short -n 8 \
    --timeout 120 --junitxml="$OUT/cuda_tests.xml" ${TESTS:-tests/}
stage matmul_gpu ${MATMUL_SECONDS:-150} python3 benchmarks/matmul_gpu.py
stage ops_f32 100 python3 benchmarks/ops_table.py --device cuda --no-compile --rounds 2 --only matmul,linear,conv,softmax,layernorm,attention
stage ops_f16 60 python3 benchmarks/ops_table.py --device cuda --dtype float16 --no-compile --rounds 2 --only matmul,linear,attention
stage models_3xtf32 ${X3_SECONDS:-150} python3 benchmarks/models.py ${X3_MODELS:-bert gpt2 vit resnet50} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --fp32-precision 3xtf32 --batch ${X3_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models_3xtf32_mma ${X3_SECONDS:-150} env TASKMAP_WGMMA=0 python3 benchmarks/models.py ${X3_MODELS:-bert gpt2 vit resnet50} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --fp32-precision 3xtf32 --batch ${X3_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models_f16 ${F16_SECONDS:-150} python3 benchmarks/models.py ${F16_MODELS:-bert gpt2 vit resnet50} \
    --device cuda --dtype float16 --rounds 2 --seconds 0.5 --keep-going --batch ${F16_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models_bf16 ${F16_SECONDS:-150} python3 benchmarks/models.py ${F16_MODELS:-bert gpt2 vit resnet50} \
    --device cuda --dtype bfloat16 --rounds 2 --seconds 0.5 --keep-going --batch ${F16_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models_f16_mma ${F16_SECONDS:-150} env TASKMAP_WGMMA=0 python3 benchmarks/models.py ${F16_MODELS:-bert gpt2 vit resnet50} \
    --device cuda --dtype float16 --rounds 2 --seconds 0.5 --keep-going --batch ${F16_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models ${MODEL_SECONDS:-300} python3 benchmarks/models.py ${MODELS:-resnet50 bert gpt2 mobilenet_v2 inception_v3 vit} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going ${MODEL_FLAGS:---batch 1 8 --peers eager torch.compile --no-compile-times}
stage models_tf32 ${TF32_SECONDS:-200} python3 benchmarks/models.py ${TF32_MODELS:-resnet50 bert gpt2 vit} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --tf32 --batch ${TF32_BATCH:-1 8} --peers eager torch.compile --no-compile-times
stage models_tf32_mma ${WGMMA_SECONDS:-200} env TASKMAP_WGMMA=0 python3 benchmarks/models.py ${TF32_MODELS:-resnet50 bert gpt2 vit} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --tf32 --batch ${TF32_BATCH:-1 8} --peers eager torch.compile --no-compile-times
stage models_tf32_tma ${TMA_SECONDS:-200} env TASKMAP_WGMMA=tma python3 benchmarks/models.py ${TMA_MODELS:-bert gpt2 vit} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --tf32 --batch ${TMA_BATCH:-8} --peers eager torch.compile --no-compile-times
stage models_f16_tma ${TMA_SECONDS:-200} env TASKMAP_WGMMA=tma python3 benchmarks/models.py ${TMA_MODELS:-bert gpt2 vit} \
    --device cuda --dtype float16 --rounds 2 --seconds 0.5 --keep-going --batch ${TMA_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models_3xtf32_tma ${TMA_SECONDS:-200} env TASKMAP_WGMMA=tma python3 benchmarks/models.py ${TMA_MODELS:-bert gpt2 vit} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --fp32-precision 3xtf32 --batch ${TMA_BATCH:-8} \
    --peers eager torch.compile --no-compile-times
stage models_tuned ${TUNED_SECONDS:-240} env TASKMAP_TUNE=topk python3 benchmarks/models.py ${TUNED_MODELS:-resnet50 bert} \
    --device cuda --rounds 2 --seconds 0.5 --keep-going --batch ${TUNED_BATCH:-1 8} --peers torch.compile --no-compile-times
[[ "$WANT" == *" models_tuned "* ]] && python3 -m taskmap records export "$OUT/records"   # to ship: taskmap/schedule/records
stage wgmma_sweep ${SWEEP_SECONDS:-200} python3 benchmarks/model_vs_exhaustive.py wgmma --device cuda --no-confirm \
    --dump "$OUT/wgmma_sweep.json" ${SWEEP_ONLY:+--only $SWEEP_ONLY}
stage wgmma_tma_sweep ${SWEEP_SECONDS:-200} env TASKMAP_WGMMA=tma python3 benchmarks/model_vs_exhaustive.py wgmma \
    --device cuda --no-confirm --dump "$OUT/wgmma_tma_sweep.json" ${SWEEP_ONLY:+--only $SWEEP_ONLY}
stage gpu_exhaustive ${EXHAUSTIVE_SECONDS:-240} python3 benchmarks/model_vs_exhaustive.py gpu_matmul --device cuda \
    --only ${EXHAUSTIVE_ONLY:-128x768x768 512x4608x49 1x2048x1000}
stage generate ${GENERATE_SECONDS:-200} python3 benchmarks/generate.py --device cuda --rounds 3 --model ${GENERATE_MODEL:-gpt2}
stage profile ${PROFILE_SECONDS:-90} python3 benchmarks/profile_model.py --device cuda --top 25 --batch ${PROFILE_BATCH:-8} \
    ${PROFILE_MODELS:-bert vit}
