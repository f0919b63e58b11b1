"""``serve``: launch ``lmdeploy serve api_server`` on a quantized checkpoint and wait until it answers.

lmdeploy runs only on CUDA GPUs and pins its own torch, so it lives in its own environment and is driven as a
command (``--lmdeploy PATH`` or ``lmdeploy`` on PATH). The model format comes from the checkpoint's
``quantization_config`` (``awq`` or ``gptq``; ``hf`` for an unquantized folder).
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
FORMATS = {"awq": "awq", "gptq": "gptq"}


class ServeError(DeployOptError):
    """The serving host cannot run lmdeploy, or the server did not come up."""


def quantization_config(checkpoint: Path) -> dict:
    """The checkpoint's ``quantization_config`` ({} for a float model)."""
    config_path = Path(checkpoint) / "config.json"
    if not config_path.is_file():
        raise InputError(f"'{checkpoint}' is not a checkpoint folder (no config.json); pass quantize-llm's output")
    try:
        return json.loads(config_path.read_text(encoding="utf-8")).get("quantization_config") or {}
    except json.JSONDecodeError as exc:
        raise InputError(f"'{config_path}' is not valid JSON: {exc}") from exc


def choose_backend(checkpoint: Path, backend: str) -> str:
    """'auto' → turbomind when it accepts the checkpoint, else pytorch; an explicit turbomind it would refuse is
    an error naming why."""
    from exporters.lmdeploy import lmdeploy_problems

    quant = quantization_config(checkpoint)
    problems = lmdeploy_problems(quant) if quant else []
    if backend == "turbomind" and problems:
        raise ConfigError(
            f"TurboMind refuses '{checkpoint}': {'; '.join(problems)}; serve with --backend pytorch "
            "or requantize with group_size 128 and desc_act false"
        )
    if backend == "auto":
        if problems:
            log.warning(
                "TurboMind would refuse this checkpoint (%s): using lmdeploy's PyTorch engine", "; ".join(problems)
            )
        return "pytorch" if problems else "turbomind"
    return backend


def model_format(checkpoint: Path) -> str:
    """lmdeploy's ``--model-format`` for a checkpoint folder, from its config.json."""
    quant = quantization_config(checkpoint)
    method = str(quant.get("quant_method", "")).lower()
    if not method:
        return "hf"
    if method not in FORMATS:
        raise ConfigError(
            f"checkpoint '{checkpoint}' has quant_method '{method}', which lmdeploy does not serve; "
            f"quantize with --method gptq, awq or rtn"
        )
    return FORMATS[method]


def serve_command(checkpoint: Path, serve: ServeConfig, lmdeploy: str = "lmdeploy") -> list[str]:
    """The exact ``lmdeploy serve api_server`` command line for ``checkpoint``."""
    command = [
        lmdeploy,
        "serve",
        "api_server",
        str(Path(checkpoint).resolve()),
        "--model-format",
        model_format(checkpoint),
        "--backend",
        choose_backend(checkpoint, serve.backend),
        "--server-port",
        str(serve.port),
        "--tp",
        str(serve.tp),
    ]
    if serve.session_len:
        command += ["--session-len", str(serve.session_len)]
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
