#!/usr/bin/env bash
# The LLM GPU check, for a user's machine with an NVIDIA GPU and a package index: serve a W4A16 SmolLM2
# checkpoint with lmdeploy through `python -m deploy_opt serve` (backend auto: deploy_opt picks the lmdeploy engine
# that accepts the checkpoint, or refuses it with the re-quantize advice), send four OpenAI-style chat requests,
# and print the answers and tokens/s; then serve it again with the int8 KV cache (`serve --kv-cache int8`, lmdeploy's
# --quant-policy 8) and print the same, with the GPU memory in use and the KV-cache size lmdeploy logged.
#
#   bash benchmarks/gpu_llm_check.sh [CHECKPOINT_DIR]
#
# Without CHECKPOINT_DIR it first runs `quantize-llm` with its defaults (a checkpoint lmdeploy serves) on
# SmolLM2-135M in deploy_opt's own environment (`python` on PATH with `pip install -e .[llm]`, CPU torch).
# Time: quantizing <= 10 min on the CPU (skip it by passing a checkpoint); serving and the requests <= 5 min;
# the first run also installs lmdeploy's venv (lmdeploy pins a CUDA torch of its own: about 3 GB, minutes).
# Needs: an NVIDIA GPU and driver that lmdeploy 0.18's CUDA 12 build runs on, python3 >= 3.10, curl, setsid
# (util-linux), the PyPI index.
#
# Pins (checked against PyPI on 2026-12-01): lmdeploy 0.18.0 with torch 2.12.1 and torchvision 0.27.1, the newest
# its requirements allow (torch <= 2.12.1, torchvision <= 0.27.1). The rest of its tree is resolved by pip within
# lmdeploy's own bounds and written to OUT/lmdeploy_freeze.txt. lmdeploy pins its own torch, so it never shares
# deploy_opt's environment.
#
# The server runs in its own process group (setsid) and the EXIT trap, set before it starts, kills that whole
# group: `deploy_opt serve` and the lmdeploy server it launched, on success, failure or Ctrl-C.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/deploy_opt_llm_check}"
VENV="${LMDEPLOY_VENV:-/tmp/lmdeploy_venv}"
PORT="${PORT:-23333}"
LMDEPLOY_PINS=("lmdeploy==0.18.0" "torch==2.12.1" "torchvision==0.27.1")
mkdir -p "$OUT"
log() { printf '[gpu_llm_check %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if ! command -v nvidia-smi > /dev/null || ! timeout 30 nvidia-smi -L; then
  log "no NVIDIA GPU: lmdeploy runs only on CUDA"
  exit 2
fi
for tool in curl setsid python; do
  command -v "$tool" > /dev/null || { log "needs $tool on PATH"; exit 2; }
done

# 1. The checkpoint: given, or quantize-llm's default (exit 1 there is the perplexity gate: the checkpoint exists).
CKPT="${1:-}"
if [ -z "$CKPT" ]; then
  log "quantizing SmolLM2-135M with quantize-llm's defaults (64 samples x 256 tokens)"
  rc=0
  (cd "$REPO" && timeout 600 python -m deploy_opt quantize-llm --samples 64 --max-seq-len 256 --generations 2 \
      --name smollm2-w4a16 --output-dir "$OUT/reports") || rc=$?
  if [ "$rc" -eq 1 ]; then
    log "quantize-llm: the perplexity gate failed (see quantize_report.json); serving the checkpoint anyway"
  elif [ "$rc" -ne 0 ]; then
    log "quantize-llm failed (exit $rc)"
    exit 1
  fi
  CKPT="$OUT/reports/smollm2-w4a16/checkpoint"
fi
[ -f "$CKPT/config.json" ] || { log "no checkpoint at $CKPT"; exit 2; }

# 2. lmdeploy in its own venv, reused while the pins are the same.
if [ ! -f "$VENV/.pins" ] || [ "$(cat "$VENV/.pins")" != "${LMDEPLOY_PINS[*]}" ]; then
  log "installing ${LMDEPLOY_PINS[*]} into $VENV"
  rm -rf "$VENV"
  timeout 60 python3 -m venv "$VENV"
  timeout 1200 "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${LMDEPLOY_PINS[@]}"
  echo "${LMDEPLOY_PINS[*]}" > "$VENV/.pins"
fi
timeout 60 "$VENV/bin/python" -m pip freeze > "$OUT/lmdeploy_freeze.txt"
timeout 120 "$VENV/bin/python" -c \
  'import lmdeploy, torch; assert lmdeploy.__version__ == "0.18.0", lmdeploy.__version__; \
   assert torch.cuda.is_available(), "lmdeploy venv: torch sees no GPU"; \
   print("lmdeploy", lmdeploy.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))'

# 3. The exact command `serve --backend auto` will run; it exits 2 when no lmdeploy engine accepts the checkpoint.
command_line="$(cd "$REPO" && timeout 60 python -m deploy_opt serve "$CKPT" --dry-run --port "$PORT" \
  --lmdeploy "$VENV/bin/lmdeploy")"
echo "$command_line" | tee "$OUT/serve_command.txt"
engine="$(sed -n 's/.*--backend \([a-z]*\).*/\1/p' <<< "$command_line")"
log "deploy_opt routes the checkpoint to lmdeploy's ${engine:-?} engine"

# 4. Serve in a new process group; the trap that kills the group is in place before the server starts. Run twice:
#    the fp16 KV cache, then the int8 one (serve --kv-cache int8 → lmdeploy --quant-policy 8).
SERVER_PGID=""
stop_server() {
  if [ -n "$SERVER_PGID" ] && kill -0 -- "-$SERVER_PGID" 2> /dev/null; then
    log "stopping the server (process group $SERVER_PGID)"
    if ! kill -TERM -- "-$SERVER_PGID" 2> /dev/null; then return 0; fi  # it exited between the test and the kill
    for _ in $(seq 1 15); do
      if ! kill -0 -- "-$SERVER_PGID" 2> /dev/null; then return 0; fi
      sleep 1
    done
    if kill -KILL -- "-$SERVER_PGID" 2> /dev/null; then log "the server ignored SIGTERM for 15 s: killed"; fi
  fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM
serve_and_ask() {
KV="$1"
log "starting: python -m deploy_opt serve $CKPT --kv-cache $KV (log: $OUT/serve-$KV.log)"
# A background job of a non-interactive script is not a process-group leader, so setsid does not fork: the PID
# in $! is the new session's, and its process group id.
(cd "$REPO" && exec setsid python -m deploy_opt serve "$CKPT" --port "$PORT" --kv-cache "$KV" \
  --lmdeploy "$VENV/bin/lmdeploy") > "$OUT/serve-$KV.log" 2>&1 < /dev/null &
SERVER_PGID=$!
ready=0
for _ in $(seq 1 150); do  # up to 5 minutes: lmdeploy's first start compiles kernels
  if curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; then ready=1; break; fi
  kill -0 "$SERVER_PGID" 2> /dev/null || break
  sleep 2
done
if [ "$ready" != 1 ]; then
  log "the server did not come up; the end of $OUT/serve-$KV.log:"
  tail -40 "$OUT/serve-$KV.log" >&2
  exit 1
fi

# 5. Four chat requests, one at a time.
echo "== KV cache: $KV =="
timeout 300 python - "$PORT" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}/v1"
model = json.load(urllib.request.urlopen(f"{base}/models", timeout=30))["data"][0]["id"]
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
    answer = reply["choices"][0]["message"]["content"].strip().replace("\n", " ")
    if tokens == 0 or not answer:
        sys.exit(f"empty answer to {prompt!r}: {reply}")
    total_tokens, total_s = total_tokens + tokens, total_s + seconds
    print(f"- {prompt}\n  → {answer[:200]}\n  ({tokens} tokens, {tokens / seconds:.1f} tokens/s)")
print(f"overall: {total_tokens} tokens in {total_s:.2f} s = {total_tokens / total_s:.1f} tokens/s (one request at a time)")
PY
log "KV cache $KV: GPU memory in use $(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -1)"
grep -iE "cache|block" "$OUT/serve-$KV.log" | grep -iE "token|block|memory" | tail -3 >&2 || true
stop_server
SERVER_PGID=""
}
for KV in none int8; do serve_and_ask "$KV"; done
log "done; the servers' logs are $OUT/serve-none.log and $OUT/serve-int8.log"
