#!/usr/bin/env bash
# The venv that quantize-llm's --reference-gptq finds by itself: llm-compressor with its own transformers (it pins
# one that deploy_opt's environment need not have) and this machine's CPU torch. Pins: deploy_opt/llm/reference_gptq.py.
#   bash benchmarks/llm/reference_venv.sh          # -> benchmarks/corpus/.cache/llmcompressor-venv
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"  # benchmarks/
venv="${1:-$here/corpus/.cache/llmcompressor-venv}"
pins="$(cd "$here/.." && python -c 'from deploy_opt.llm.reference_gptq import PINS; print(*PINS)')"
python -m venv "$venv"
"$venv/bin/python" -m pip install $pins
"$venv/bin/python" -c 'import llmcompressor, importlib.metadata as m; print("llmcompressor", m.version("llmcompressor"))'
