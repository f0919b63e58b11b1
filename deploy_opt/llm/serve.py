"""``serve``: launch ``lmdeploy serve api_server`` on a quantized checkpoint and wait until it answers.

lmdeploy runs only on CUDA GPUs and pins its own torch, so it lives in its own environment and is driven as a
command (``--lmdeploy PATH`` or ``lmdeploy`` on PATH). Both engines of lmdeploy 0.18 read the format from the
checkpoint's ``quantization_config``, so the command routes by lmdeploy's own rules (``exporters/lmdeploy.py``:
``engine_problems``) and refuses, with re-quantize advice, what neither engine serves. ``--model-format`` goes to
TurboMind only, where it must equal the checkpoint's ``quant_method`` (``turbomind/converter.py``: ``get_tm_config``);
the PyTorch engine takes none (``pytorch/config.py``: ``_patch_quantization_config`` raises "Unsupported weight
quantization method: hf" for ``--model-format hf`` on a float model).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from deploy_opt.config.serve import ServeConfig
from dopt_common.errors import ConfigError, DeployOptError, InputError

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install lmdeploy in its own environment on a CUDA machine: python -m venv ~/.venvs/lmdeploy && "
    "~/.venvs/lmdeploy/bin/pip install lmdeploy, then pass --lmdeploy ~/.venvs/lmdeploy/bin/lmdeploy"
)


class ServeError(DeployOptError):
    """The serving host cannot run lmdeploy, or the server did not come up."""


def checkpoint_config(checkpoint: Path) -> dict:
    """The checkpoint's ``config.json``."""
    config_path = Path(checkpoint) / "config.json"
    if not config_path.is_file():
        raise InputError(f"'{checkpoint}' is not a checkpoint folder (no config.json); pass quantize-llm's output")
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"'{config_path}' is not valid JSON: {exc}") from exc


def quantization_config(checkpoint: Path) -> dict:
    """The checkpoint's ``quantization_config`` ({} for a float model)."""
    return checkpoint_config(checkpoint).get("quantization_config") or {}


def choose_backend(checkpoint: Path, backend: str) -> str:
    """The lmdeploy engine for ``checkpoint``: 'auto' → TurboMind when it serves it, else the PyTorch engine; an
    engine that would refuse it (explicit, or both for 'auto') is a ConfigError with the re-quantize advice.

    The architecture counts as well: lmdeploy's CLI runs TurboMind only for the architectures in its list, and
    sends any other to the PyTorch engine (which has no GPTQ), whatever ``--backend`` says."""
    from exporters.lmdeploy_engines import ENGINES, architecture_of, engine_problems, requantize_advice

    config = checkpoint_config(checkpoint)
    quant, architecture = config.get("quantization_config") or {}, architecture_of(config)
    problems = engine_problems(quant, architecture)
    if backend == "auto":
        serving = [engine for engine in ENGINES if not problems[engine]]
        if not serving:
            turbomind, pytorch = ("; ".join(problems[engine]) for engine in ENGINES)
            raise ConfigError(
                f"lmdeploy 0.18 serves '{checkpoint}' on neither engine (TurboMind: {turbomind}; "
                f"PyTorch engine: {pytorch}); {requantize_advice(quant, architecture)}"
            )
        if serving[0] != "turbomind":
            log.info(
                "TurboMind would refuse this checkpoint (%s): using lmdeploy's PyTorch engine",
                "; ".join(problems["turbomind"]),
            )
        return serving[0]
    if problems[backend]:
        other = next(engine for engine in ENGINES if engine != backend)
        fix = f"serve with --backend {other}" if not problems[other] else requantize_advice(quant, architecture)
        raise ConfigError(f"lmdeploy's {backend} engine refuses '{checkpoint}': {'; '.join(problems[backend])}; {fix}")
    return backend


def model_format_args(checkpoint: Path, backend: str) -> list[str]:
    """``--model-format`` for TurboMind on a quantized folder (it must match quant_method); none otherwise."""
    method = str(quantization_config(checkpoint).get("quant_method", ""))
    return ["--model-format", method] if backend == "turbomind" and method else []


def serve_command(checkpoint: Path, serve: ServeConfig, lmdeploy: str = "lmdeploy") -> list[str]:
    """The exact ``lmdeploy serve api_server`` command line for ``checkpoint`` (ConfigError if no engine serves it,
    or ``serve.tp`` GPUs cannot split it)."""
    from exporters.lmdeploy_engines import tp_problems

    backend = choose_backend(checkpoint, serve.backend)
    split = tp_problems(checkpoint_config(checkpoint), quantization_config(checkpoint), serve.tp)
    if split:
        raise ConfigError(
            f"'{checkpoint}' cannot be served on --tp {serve.tp}: {'; '.join(split)}; use a --tp that divides them"
        )
    command = [
        lmdeploy,
        "serve",
        "api_server",
        str(Path(checkpoint).resolve()),
        "--backend",
        backend,
        *model_format_args(checkpoint, backend),
        "--server-port",
        str(serve.port),
        "--tp",
        str(serve.tp),
    ]
    if serve.session_len:
        command += ["--session-len", str(serve.session_len)]
    if serve.kv_cache != "none":
        from deploy_opt.llm.kv_cache import check_engine_policy

        command += ["--quant-policy", str(check_engine_policy(serve.kv_cache, backend))]
    return command


def cuda_gpus() -> list[str]:
    """The NVIDIA GPUs ``nvidia-smi -L`` lists (empty without a driver or GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.splitlines() if line.startswith("GPU ")]


def check_host(lmdeploy: str, tp: int) -> str:
    """The lmdeploy executable's path; a ServeError naming what is missing and how to install it."""
    gpus = cuda_gpus()
    if not gpus:
        raise ServeError(
            f"serve needs a CUDA GPU and nvidia-smi finds none here (lmdeploy never runs on a CPU); "
            f"run it on a GPU machine: {INSTALL_HINT}"
        )
    if tp > len(gpus):
        raise ConfigError(f"serve.tp {tp} but this machine has {len(gpus)} GPU(s); set --tp {len(gpus)}")
    path = shutil.which(lmdeploy)
    if path is None:
        raise ServeError(f"'{lmdeploy}' is not on PATH; {INSTALL_HINT}")
    return path


def launch(command: list[str], port: int, timeout_s: int) -> subprocess.Popen:
    """Start the server and wait until ``/v1/models`` answers; the process is left running."""
    log.info("starting: %s", " ".join(command))
    process = subprocess.Popen(command)
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{port}/v1/models"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServeError(f"lmdeploy exited with code {process.returncode} before it was ready (see its log above)")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    log.info("ready: %s", url)
                    return process
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    process.terminate()
    raise ServeError(f"lmdeploy did not answer {url} within {timeout_s} s; raise serve.ready_timeout_s")
