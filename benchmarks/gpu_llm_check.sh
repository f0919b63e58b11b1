#!/usr/bin/env bash
# The LLM GPU check: on a machine with an NVIDIA GPU, install lmdeploy in its own venv, serve the W4A16 SmolLM2
# checkpoint that quantize-llm wrote, send a few OpenAI-style requests and print the answers and tokens/s.
# Designed to finish in under 8 minutes.
#
#   bash benchmarks/gpu_llm_check.sh [CHECKPOINT_DIR]
#
# Without CHECKPOINT_DIR it quantizes SmolLM2-135M first (AWQ, group 64: SmolLM2's hidden size 576 rules out 128)
# with deploy_opt's own environment (python on PATH, `pip install -e .[llm]`). lmdeploy pins its own torch, so it
# never shares that environment. Offline machines: PIP_FIND_LINKS=<wheel dir> PIP_NO_INDEX=1.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/deploy_opt_llm_check}"
VENV="${LMDEPLOY_VENV:-/tmp/lmdeploy_venv}"
PORT="${PORT:-23333}"
mkdir -p "$OUT"
log() { printf '[gpu_llm_check %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

nvidia-smi -L || { log "no NVIDIA GPU: lmdeploy runs only on CUDA"; exit 2; }

CKPT="${1:-}"
if [ -z "$CKPT" ]; then
  log "quantizing SmolLM2-135M (awq, group 64, 128 samples x 256 tokens)"
  (cd "$REPO" && timeout 300 python -m deploy_opt quantize-llm --method awq --group-size 64 --samples 128 \
      --max-seq-len 256 --generations 2 --name smollm2-awq --output-dir "$OUT/reports") || true
  CKPT="$OUT/reports/smollm2-awq/checkpoint"
fi
[ -f "$CKPT/config.json" ] || { log "no checkpoint at $CKPT"; exit 2; }

if [ ! -x "$VENV/bin/lmdeploy" ]; then
  log "installing lmdeploy into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q lmdeploy
fi
"$VENV/bin/lmdeploy" --version || true

python -m deploy_opt serve "$CKPT" --dry-run --port "$PORT" --lmdeploy "$VENV/bin/lmdeploy"
serve_and_wait() {
  local backend="$1"
  log "starting lmdeploy ($backend)"
  (cd "$REPO" && python -m deploy_opt serve "$CKPT" --port "$PORT" --backend "$backend" \
      --lmdeploy "$VENV/bin/lmdeploy") > "$OUT/serve_$backend.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 90); do
    if curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; then return 0; fi
    if ! kill -0 "$SERVER" 2> /dev/null; then return 1; fi
    sleep 2
  done
  return 1
}
# TurboMind is the fast W4A16 path; the PyTorch engine takes group sizes TurboMind may refuse.
if ! serve_and_wait turbomind; then
  tail -20 "$OUT/serve_turbomind.log" >&2 || true
  kill "$SERVER" 2> /dev/null || true; sleep 3
  serve_and_wait pytorch || { tail -40 "$OUT/serve_pytorch.log" >&2; exit 1; }
fi
trap 'kill $SERVER 2> /dev/null || true' EXIT

python - "$PORT" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}/v1"
model = json.load(urllib.request.urlopen(f"{base}/models"))["data"][0]["id"]
prompts = [
    "What is the capital of France? Answer in one word.",
    "Write a Python function that reverses a string.",
    "Explain in two sentences what a list comprehension is.",
    "Name three prime numbers.",
]
total_tokens, total_s = 0, 0.0
for prompt in prompts:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 96, "temperature": 0}
    req = urllib.request.Request(f"{base}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    reply = json.load(urllib.request.urlopen(req, timeout=120))
    seconds = time.perf_counter() - start
    tokens = reply["usage"]["completion_tokens"]
    total_tokens, total_s = total_tokens + tokens, total_s + seconds
    answer = reply["choices"][0]["message"]["content"].strip().replace("\n", " ")
    print(f"- {prompt}\n  → {answer[:200]}\n  ({tokens} tokens, {tokens / seconds:.1f} tokens/s)")
print(f"overall: {total_tokens} tokens in {total_s:.2f} s = {total_tokens / total_s:.1f} tokens/s (one request at a time)")
PY
log "done"
