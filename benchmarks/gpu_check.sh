#!/usr/bin/env bash
# The GPU check, for a user's machine with an NVIDIA GPU and a package index: build the demo and MiniLM with
# `--profile a100` (TensorRT + ORT CUDA targets), verify that every artifact (Q/DQ ONNX, TensorRT cache, AIMET
# encodings, the engine) carries scales.json bit for bit (`align verify`), compare the backends on fixed samples,
# and print one table.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#
# Time: the checks take <= 16 minutes (two builds <= 420 s each, align verify <= 60 s each); the first run also
# installs (about 3 GB of TensorRT, cuDNN and CUDA libraries: minutes, depending on the line). A rerun reuses the
# venv while its pins are unchanged.
# Needs: an NVIDIA driver for CUDA 13 (nvidia-smi reports "CUDA Version: 13.x"), python3 >= 3.10, the PyPI index
# and NVIDIA's (TensorRT's libraries are published only there; PyPI's tensorrt-cu13-libs is a stub that would
# fetch them from it during its build, so this script asks NVIDIA's index for the real wheel directly).
#
# Pins (checked against the package indexes on 2026-12-01):
#   torch 2.13.0, the CPU wheel: torch only exports and evaluates the reference here; the GPU work is ORT and
#     TensorRT, so no multi-GB CUDA torch is pulled;
#   tensorrt-cu13 10.16.1.11 (the last 10.x; an sdist holding only the Python package) with
#     tensorrt-cu13-libs and tensorrt-cu13-bindings of the same version;
#   onnxruntime-gpu[cuda,cudnn] 1.31.1 (built for CUDA 13; the extras install its CUDA and cuDNN libraries, without
#     which sessions fall back to the CPU). It replaces onnxruntime: the two overwrite each other's folder;
#   cuda-python 13.4.4 (cuda-bindings 13.4.x: `from cuda.bindings import runtime`).
# Offline mirrors: PIP_FIND_LINKS=<wheel dir> PIP_NO_INDEX=1 (pip honours both), TORCH_INDEX, NVIDIA_INDEX.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-${OUT:-/tmp/deploy_opt_gpu_check}}"
VENV="${VENV:-/tmp/deploy_opt_gpu_venv}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
NVIDIA_INDEX="${NVIDIA_INDEX:-https://pypi.nvidia.com}"
TRT_VERSION=10.16.1.11
PINS=(
  "tensorrt-cu13==$TRT_VERSION" "tensorrt-cu13-libs==$TRT_VERSION" "tensorrt-cu13-bindings==$TRT_VERSION"
  "onnxruntime-gpu[cuda,cudnn]==1.31.1" "cuda-python==13.4.4"
)
mkdir -p "$OUT"
log() { printf '[gpu_check %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# 1. The GPU and its driver.
if ! command -v nvidia-smi > /dev/null; then
  log "no nvidia-smi: this check needs an NVIDIA GPU and its driver"
  exit 2
fi
timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
banner="$(timeout 30 nvidia-smi)"
cuda_driver="$(sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' <<< "$banner" | head -1)"
if [ -z "$cuda_driver" ] || [ "$cuda_driver" -lt 13 ]; then
  log "the driver supports CUDA '${cuda_driver:-?}'; onnxruntime-gpu 1.31 and tensorrt-cu13 need CUDA 13: update it"
  exit 2
fi

# 2. The venv, reused while the pins are the same.
stamp="torch==2.13.0+cpu ${PINS[*]} $(sha256sum "$REPO/pyproject.toml" | cut -c1-16)"
if [ ! -f "$VENV/.pins" ] || [ "$(cat "$VENV/.pins")" != "$stamp" ]; then
  log "creating $VENV"
  rm -rf "$VENV"
  timeout 60 python3 -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  timeout 300 "${PIP[@]}" "torch==2.13.0" --index-url "$TORCH_INDEX"
  timeout 300 "${PIP[@]}" -e "${REPO}[examples]"
  # deploy_opt depends on onnxruntime (CPU); onnxruntime-gpu must replace it, not sit beside it.
  timeout 60 "$VENV/bin/python" -m pip uninstall -q -y onnxruntime
  timeout 900 "${PIP[@]}" --extra-index-url "$NVIDIA_INDEX" \
    --only-binary "tensorrt-cu13-libs,tensorrt-cu13-bindings,onnxruntime-gpu" "${PINS[@]}"
  echo "$stamp" > "$VENV/.pins"
fi
PY="$VENV/bin/python"
timeout 60 "$PY" -m pip freeze > "$OUT/pip_freeze.txt"

# 3. Each library really reaches the GPU: TensorRT builds a builder, cuda-bindings counts devices, and an ORT
#    session on a tiny model runs on CUDAExecutionProvider, not a silent CPU fallback.
log "checking tensorrt, cuda-bindings and onnxruntime-gpu on the GPU"
timeout 120 "$PY" - "$TRT_VERSION" <<'PY'
import sys
import numpy as np
import onnx
import onnxruntime as ort
import tensorrt as trt
from cuda.bindings import runtime as cudart
from onnx import TensorProto, helper

from dopt_common.ort import create_session

assert trt.__version__ == sys.argv[1], f"tensorrt {trt.__version__}, expected {sys.argv[1]}"
assert trt.Builder(trt.Logger(trt.Logger.WARNING)) is not None, "TensorRT cannot create a builder on this GPU"
err, count = cudart.cudaGetDeviceCount()
assert int(err) == 0 and count > 0, f"cudaGetDeviceCount: {err}, {count}"
node = helper.make_node("Relu", ["x"], ["y"])
graph = helper.make_graph([node], "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
# the project's one opener, which also loads the pip-installed CUDA and cuDNN libraries (preload_dlls)
session = create_session(model.SerializeToString(), providers=("CUDAExecutionProvider",))
assert session.get_providers()[0] == "CUDAExecutionProvider", f"ORT fell back to {session.get_providers()}"
assert session.run(None, {"x": np.array([-1, 2], np.float32)})[0].tolist() == [0, 2]
print(f"tensorrt {trt.__version__}; onnxruntime {ort.__version__} {session.get_providers()}; {count} CUDA device(s)")
PY

# 4. Builds and alignment. A failed step is recorded and the others still run; the script exits 1 at the end.
export DEPLOY_OPT_CACHE="$OUT/cache"
status=0
for cfg in deploy_opt/demo/digits.yaml deploy_opt/demo/minilm.yaml; do
  name="$(basename "$cfg" .yaml)"
  log "build $cfg (profile a100: symmetric int8, targets tensorrt + ort-cuda)"
  # The auto search is bounded by auto.budget_s (120 s here); the whole MiniLM build took 8.5 min on 2 CPU cores.
  # The speed gate stays on: a GPU profile's speed is the engine's against ORT CUDA FP32, never a CPU timing.
  # Exit 1 is the gate's verdict (printed below); 2 or more is a failed build.
  rc=0
  (cd "$REPO" && timeout 420 "$PY" -m deploy_opt build "$cfg" --profile a100 --output-dir "$OUT/reports" \
      --set benchmark.batch_sizes=[1,32] --set benchmark.repeats=30 \
      --set auto.budget_s=120) > "$OUT/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ge 2 ]; then
    log "build $cfg failed (exit $rc); the end of $OUT/$name.log:"
    tail -20 "$OUT/$name.log" >&2
    status=1
  else
    log "build $cfg: exit $rc (1: the gate failed); its gate:"
    grep -E "(PASS|FAIL|SKIP)  " "$OUT/$name.log" >&2 || tail -5 "$OUT/$name.log" >&2
  fi
done
shopt -s nullglob
for dir in "$OUT"/reports/*/; do
  log "align verify $dir"
  if ! (cd "$REPO" && timeout 60 "$PY" -m deploy_opt align verify "$dir"); then
    status=1
  fi
done
shopt -u nullglob

# 5. Each calibration.cache names the installed TensorRT in its header: TensorRT skips a cache whose header names
#    another version, and the split cu13 wheels install no distribution named "tensorrt" (issue 33).
log "calibration cache headers against tensorrt.__version__"
if ! (cd "$REPO" && timeout 60 "$PY" - "$OUT/reports" <<'PY'
import sys
from pathlib import Path
import tensorrt as trt
from exporters.tensorrt.cache import read_trt_cache, trt_version_number
caches = sorted(Path(sys.argv[1]).glob("*/calibration.cache"))
assert caches, "no build wrote a calibration.cache"
want = f"TRT-{trt_version_number(trt.__version__)}-"
for cache in caches:
    header = cache.read_text().splitlines()[0]
    assert header.startswith(want), f"{cache}: header {header!r}, installed tensorrt {trt.__version__} wants {want!r}"
    read_trt_cache(cache)
    print(f"{cache.parent.name}: {header} (tensorrt {trt.__version__})")
PY
); then
  status=1
fi

timeout 30 "$PY" - "$OUT/reports" <<'PY'
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
log "done (exit $status); reports in $OUT/reports, pip freeze in $OUT/pip_freeze.txt"
exit "$status"
