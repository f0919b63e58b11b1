#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, build the demo and MiniLM for TensorRT and ORT CUDA, verify that
# every artifact (Q/DQ ONNX, TensorRT cache, AIMET encodings, the engine) carries scales.json bit for bit, compare
# the backends on fixed samples, and print one table. Designed to finish in under 8 minutes.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#
# It installs into its own venv (tensorrt and onnxruntime-gpu do not belong in the CPU environment:
# onnxruntime-gpu and onnxruntime overwrite each other's folder). Offline machines: set PIP_FIND_LINKS=<wheel dir>
# and PIP_NO_INDEX=1; pip honours both.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-${OUT:-/tmp/deploy_opt_gpu_check}}"
VENV="${VENV:-/tmp/deploy_opt_gpu_venv}"
mkdir -p "$OUT"
log() { printf '[gpu_check %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || { log "no NVIDIA GPU"; exit 2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
log "installing deploy_opt + tensorrt + onnxruntime-gpu + cuda-python"
# The CPU torch is enough: torch only exports and evaluates the reference here; the GPU work is ORT and TensorRT.
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0" --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" || \
  "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e "$REPO[examples]"
"$PY" -m pip uninstall -q -y onnxruntime || true
"$PY" -m pip install -q onnxruntime-gpu "tensorrt>=10.1" cuda-python
"$PY" - <<'PY'
import onnxruntime as ort, tensorrt as trt
print("onnxruntime", ort.__version__, ort.get_available_providers())
print("tensorrt", trt.__version__)
PY

export DEPLOY_OPT_CACHE="$OUT/cache"
status=0
for cfg in deploy_opt/demo/digits.yaml deploy_opt/demo/minilm.yaml; do
  log "build $cfg (profile a100: symmetric int8, targets tensorrt + ort-cuda)"
  (cd "$REPO" && timeout 240 "$PY" -m deploy_opt build "$cfg" --profile a100 --output-dir "$OUT/reports" \
      --set benchmark.batch_sizes=[1,32] --set benchmark.repeats=30 --set gate.min_speedup=null) \
      > "$OUT/$(basename "$cfg" .yaml).log" 2>&1 || { log "build $cfg exited $?"; status=1; }
done
for dir in "$OUT"/reports/*/; do
  log "align verify $dir"
  (cd "$REPO" && "$PY" -m deploy_opt align verify "$dir") || status=1
done

"$PY" - "$OUT/reports" <<'PY'
import json, sys
from pathlib import Path
rows = []
for build_json in sorted(Path(sys.argv[1]).glob("*/build.json")):
    b = json.loads(build_json.read_text())
    trt = (b.get("backends") or {}).get("tensorrt") or {}
    cmp_path = build_json.parent / "compare.json"
    cmp = json.loads(cmp_path.read_text()) if cmp_path.is_file() else {}
    for name, backend in (cmp.get("backends") or {}).items():
        outs = backend.get("outputs") or [{}]
        first = outs[0] if isinstance(outs, list) else next(iter(outs.values()), {})
        rows.append((b["name"], name, backend.get("status", ""), first.get("cosine"), first.get("sqnr_db"),
                     first.get("top1_agreement")))
    print(f"{b['name']}: align {b.get('alignment', {}).get('verdict')}")
    print(f"{b['name']}: tensorrt {trt.get('status')}; timing {json.dumps(trt.get('timing_ms'))}")
    print(f"{b['name']}: first divergence {cmp.get('first_divergence')}")
print(f"{'build':<12} {'backend':<16} {'status':<28} {'cosine':>8} {'sqnr dB':>8} {'top1 agr':>8}")
fmt = lambda v: "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)
for r in rows:
    print(f"{r[0]:<12} {r[1]:<16} {str(r[2])[:28]:<28} {fmt(r[3]):>8} {fmt(r[4]):>8} {fmt(r[5]):>8}")
PY
log "done (exit $status); reports in $OUT/reports"
exit $status
