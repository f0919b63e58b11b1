"""Natural photographs that ship inside installed wheels, split by source image, and seeded crops of them.

Sources (no download; scikit-image's pooch-fetched images are never used): the images inside the
scikit-image wheel (``skimage/data``), matplotlib's ``grace_hopper.jpg`` and scikit-learn's two sample images.
Calibration and evaluation crops come from different photographs: ``CALIBRATION`` and ``EVALUATION`` share
none. ``motorcycle_right`` is left out because it is the stereo twin of ``motorcycle_left``.

Only three of the photographs show a person (astronaut, camera, grace_hopper), which matters for the nudenet
detector; ``PEOPLE`` names them.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

# name -> (package, path inside the package)
SOURCES: dict[str, tuple[str, str]] = {
    "astronaut": ("skimage", "data/astronaut.png"),
    "camera": ("skimage", "data/camera.png"),
    "chelsea": ("skimage", "data/chelsea.png"),
    "coffee": ("skimage", "data/coffee.png"),
    "rocket": ("skimage", "data/rocket.jpg"),
    "ihc": ("skimage", "data/ihc.png"),
    "hubble": ("skimage", "data/hubble_deep_field.jpg"),
    "motorcycle": ("skimage", "data/motorcycle_left.png"),
    "retina": ("skimage", "data/retina.jpg"),
    "coins": ("skimage", "data/coins.png"),
    "brick": ("skimage", "data/brick.png"),
    "grass": ("skimage", "data/grass.png"),
    "gravel": ("skimage", "data/gravel.png"),
    "moon": ("skimage", "data/moon.png"),
    "cell": ("skimage", "data/cell.png"),
    "clock": ("skimage", "data/clock_motion.png"),
    "color": ("skimage", "data/color.png"),
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    "china": ("sklearn", "datasets/images/china.jpg"),
    "flower": ("sklearn", "datasets/images/flower.jpg"),
}
PEOPLE = ("astronaut", "camera", "grace_hopper")
CALIBRATION = ("astronaut", "camera", "chelsea", "rocket", "china", "ihc", "hubble", "coins", "brick", "grass", "cell")
EVALUATION = ("grace_hopper", "coffee", "motorcycle", "flower", "moon", "retina", "gravel", "clock", "color")
SCALES = (1.0, 0.8, 0.65, 0.5)  # crop side as a fraction of the photo's short side


def path(name: str) -> Path:
    """The file of photograph ``name`` inside its installed package (found, not imported)."""
    package, relative = SOURCES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        extra = " (pip install scikit-image)" if package == "skimage" else ""
        raise FileNotFoundError(f"package {package} is not installed{extra}; it holds the photograph {name}")
    return Path(next(iter(spec.submodule_search_locations))) / relative


@functools.lru_cache(maxsize=32)
def load(name: str) -> Any:
    """Photograph ``name`` as an RGB PIL image (grey and RGBA files converted)."""
    from PIL import Image

    with Image.open(path(name)) as image:
        return image.convert("RGB")


def crop(image: Any, rng: np.random.Generator, side: int) -> Any:
    """A seeded square crop at one of ``SCALES``, flipped left-right half the time, resized to ``side``."""
    from PIL import Image

    short = min(image.size)
    size = max(16, int(short * SCALES[int(rng.integers(len(SCALES)))]))
    left = int(rng.integers(0, image.width - size + 1))
    top = int(rng.integers(0, image.height - size + 1))
    out = image.crop((left, top, left + size, top + size)).resize((side, side), Image.Resampling.BILINEAR)
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out


def crops(names: tuple[str, ...], count: int, side: int, seed: int) -> list[tuple[str, Any]]:
    """``count`` crops ``(id, image)``, cycling through ``names``; ids name the photograph and the crop."""
    rng = np.random.default_rng(seed)
    out = []
    for index in range(count):
        name = names[index % len(names)]
        out.append((f"{name}-{seed}-{index}", crop(load(name), rng, side)))
    return out


def to_chw(image: Any, mean: tuple[float, ...] = (0.0, 0.0, 0.0), std: tuple[float, ...] = (1.0, 1.0, 1.0)) -> Any:
    """An RGB PIL image as float32 [3, H, W]: ``(x/255 - mean) / std``."""
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    normed = (pixels - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(normed.transpose(2, 0, 1), dtype=np.float32)
