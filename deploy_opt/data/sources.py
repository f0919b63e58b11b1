"""Model and data sources: ``module:function`` references, checkpoints, and validated batches.

Data contract: a data function returns an iterable of ``(inputs, label)`` items. Each item is a batch:
``inputs`` is a dict ``{input_name: ndarray}`` (or one ndarray when the model has one input) whose leading
axis is the batch axis, and ``label`` is an array of that batch length, or None when the metric compares
against the FP32 model's own output. An item may be ``(inputs, label, ids)`` with one stable id per sample
(a file name, a row number); without ids a sample's id is a hash of its content.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.file_rows import StratifiedItem
from deploy_opt.data.files import file_items, file_path
from deploy_opt.data.labels import CLASS_METRICS, check_class_labels
from dopt_common.errors import CheckpointError, DeployOptError, InputError, SourceError, one_line
from dopt_common.names import shown

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """One validated batch: named input arrays and optional labels."""

    inputs: dict[str, np.ndarray]
    label: np.ndarray | None
    ids: tuple[str, ...] | None = None
    strata: tuple[str, ...] | None = None  # each sample's stratum from data.strata (a column or field), if named

    @property
    def size(self) -> int:
        """The number of samples in the batch."""
        return int(next(iter(self.inputs.values())).shape[0])

    def take(self, rows: list[int] | range) -> Batch:
        """The samples at ``rows``, in that order."""
        rows = list(rows)
        label = None if self.label is None else self.label[rows]
        ids = None if self.ids is None else tuple(self.ids[r] for r in rows)
        strata = None if self.strata is None else tuple(self.strata[r] for r in rows)
        return Batch({k: v[rows] for k, v in self.inputs.items()}, label, ids, strata)

    def head(self, n: int) -> Batch:
        """The first ``n`` samples."""
        return self.take(range(min(n, self.size)))


def resolve_callable(ref: str, base_dir: str | Path = ".", what: str = "reference") -> Callable[..., Any]:
    """Import ``package.module:function`` or ``path/to/file.py:function``.

    Modules beside the config file are importable, so a config can ship its own data functions.
    """
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise SourceError(f"{what} '{ref}' must look like 'package.module:function' or 'file.py:function'")
    module_name, func_name = ref.split(":")
    base = Path(base_dir).resolve()
    try:
        if module_name.endswith(".py"):
            path = (base / module_name).resolve()
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ImportError(f"no file {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if str(base) not in sys.path:
                sys.path.append(str(base))
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceError(
            f"{what} '{ref}': cannot import '{module_name}' ({exc}); fix: install the package or check the name"
        ) from exc
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the module is broken, or exits at import
        kind = (
            "called sys.exit() (argv parsing at import?)"
            if isinstance(exc, SystemExit)
            else (f"failed ({type(exc).__name__}: {shown(one_line(exc))})")
        )
        raise SourceError(
            f"{what} '{ref}': importing '{module_name}' {kind}; fix that module (run its script code only under "
            "`if __name__ == '__main__':`)"
        ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise SourceError(f"{what} '{ref}': module '{module_name}' has no callable '{func_name}'")
    return func


@contextlib.contextmanager
def user_code(what: str, at: str = "", error: type[DeployOptError] = SourceError) -> Iterator[None]:
    """Run a user's code (import, factory, data, metric): whatever it raises, ``sys.exit()`` and a
    ``KeyboardInterrupt`` it raises itself included, becomes one ``error`` naming it (exit 2); ``at`` says
    where in its output (" at item 3").

    A real Ctrl-C never arrives here as KeyboardInterrupt: the CLI's SIGINT handler raises ``Interrupted``,
    which passes through (exit 130), as do our own errors.
    """
    try:
        yield
    except (DeployOptError, StopIteration):  # StopIteration: an iterator's normal end
        raise
    except SystemExit as exc:
        raise error(
            f"{what}{at} called sys.exit({shown(exc.code, 40)}), which would end the build with nothing built; "
            "fix: raise an exception or return instead (a module that parses argv belongs under `if __name__ == "
            "'__main__':`)"
        ) from None
    except KeyboardInterrupt:
        raise error(f"{what}{at} raised KeyboardInterrupt itself; fix that function") from None
    except Exception as exc:
        raise error(f"{what} raised {type(exc).__name__}{at}: {shown(one_line(exc))}; fix that function") from exc


def call_user(func: Callable[[], Any], what: str) -> Any:
    """Call a user's function behind ``user_code``."""
    with user_code(what):
        return func()


def _guarded(source: Iterable[Any], what: str) -> Iterator[Any]:
    with user_code(what):
        iterator = iter(source)
    index = 0
    while True:
        try:
            with user_code(what, f" at item {index}"):
                item = next(iterator)
        except StopIteration:
            return
        yield item
        index += 1


def load_torch_model(factory: str, checkpoint: str | None, base_dir: str | Path) -> Any:
    """Build the model from its factory, load the checkpoint (weights only) and switch to eval mode."""
    import torch

    model = call_user(resolve_callable(factory, base_dir, "model.factory"), f"model.factory '{factory}'")
    if not isinstance(model, torch.nn.Module):
        raise SourceError(f"model.factory '{factory}' returned {type(model).__name__}, not a torch.nn.Module")
    if checkpoint:
        load_checkpoint(model, Path(base_dir) / checkpoint)
    return model.eval()


def load_checkpoint(model: Any, path: Path) -> None:
    """Load a state dict saved with ``torch.save``; mismatches name the offending keys."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"model.checkpoint '{path}' does not exist; fix the path") from exc
    except Exception as exc:  # torch raises many types for a corrupt or unsafe file
        raise CheckpointError(
            f"model.checkpoint '{path}' cannot be loaded with weights_only=True ({type(exc).__name__}); "
            "fix: save it with torch.save(model.state_dict(), path)"
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"model.checkpoint '{path}' holds a {type(state).__name__}, not a state dict")
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:3]}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:3]}")
        if shapes:
            parts.append(f"shape mismatch {shapes[:2]}")
        raise CheckpointError(
            f"model.checkpoint '{path}' does not match model.factory: {'; '.join(parts)}; "
            "fix: use the checkpoint saved from this architecture"
        )
    model.load_state_dict(state, strict=True)


def to_batch(item: Any, specs: tuple[InputSpec, ...], where: str) -> Batch:
    """Validate one ``(inputs, label)`` or ``(inputs, label, ids)`` item against the declared inputs."""
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise InputError(f"{where}: expected an (inputs, label) pair, got {type(item).__name__}")
    inputs, label = item[0], item[1]
    if not isinstance(inputs, dict):
        if len(specs) != 1:
            raise InputError(f"{where}: the model has {len(specs)} inputs; pass a dict {{name: array}}")
        inputs = {specs[0].name: inputs}
    arrays = {name: np.asarray(value) for name, value in inputs.items()}
    check_inputs(arrays, specs, where)
    if label is not None:
        label = np.asarray(label)
        size = next(iter(arrays.values())).shape[0]
        if label.shape[:1] != (size,):
            raise InputError(f"{where}: label has shape {label.shape}, expected a leading batch axis of {size}")
    ids = None
    if len(item) == 3 and item[2] is not None:
        ids = tuple(str(i) for i in item[2])
        if len(ids) != next(iter(arrays.values())).shape[0]:
            raise InputError(f"{where}: {len(ids)} ids for a batch of {next(iter(arrays.values())).shape[0]}")
    return Batch(arrays, label, ids)


def with_strata(batch: Batch, strata: list[Any] | None) -> Batch:
    """``batch`` with each sample's stratum (a file source's ``data.strata`` column), or as it is."""
    if strata is None:
        return batch
    return Batch(batch.inputs, batch.label, batch.ids, tuple(str(s) for s in strata))


def check_inputs(arrays: dict[str, np.ndarray], specs: tuple[InputSpec, ...], where: str) -> None:
    """Raise InputError when names, dtypes, ranks or static dims differ from the declaration."""
    declared = [s.name for s in specs]
    if sorted(arrays) != sorted(declared):
        raise InputError(
            f"{where}: input names {sorted(arrays)} do not match model.inputs {declared}; fix the data function "
            "or the declared names"
        )
    sizes = set()
    for spec in specs:
        array = arrays[spec.name]
        if array.dtype != np.dtype(spec.dtype):
            raise InputError(
                f"{where}: input '{spec.name}' has dtype {array.dtype}, declared {spec.dtype}; fix: cast it "
                f"with .astype('{spec.dtype}') or change model.inputs"
            )
        ok_rank = array.ndim == len(spec.shape)
        if not ok_rank or any(isinstance(d, int) and d != n for d, n in zip(spec.shape, array.shape, strict=True)):
            raise InputError(
                f"{where}: input '{spec.name}' has shape {list(array.shape)}, declared {list(spec.shape)}; "
                "fix the data or model.inputs"
            )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            raise InputError(
                f"{where}: input '{spec.name}' holds NaN or Inf ({bad} of {array.size} values); fix the data "
                "function (no model can be calibrated or judged on them)"
            )
        sizes.add(array.shape[0])
    if len(sizes) > 1:
        raise InputError(f"{where}: inputs disagree on the batch size: {sorted(sizes)}")


def iter_batches(
    ref: str,
    specs: tuple[InputSpec, ...],
    data: DataConfig,
    base_dir: str | Path,
    what: str,
    limit: int | None = None,
    classes: int | None = None,
) -> Iterator[Batch]:
    """Yield validated batches from a data function or a data file (``files.py``), stopping after ``limit``
    samples; ``data`` says how files are read (batch size, image preprocessing, tokenizer). A class metric's
    labels must be class ids, below ``classes`` when the model's class count is known."""
    path = file_path(ref, base_dir)
    if path is not None:
        source: Iterable[Any] = file_items(path, specs, data, base_dir, what)
    else:
        source = call_user(resolve_callable(ref, base_dir, what), f"{what} '{ref}'")
        if not isinstance(source, Iterable):
            raise SourceError(f"{what} '{ref}' returned {type(source).__name__}, not an iterable of (inputs, label)")
        source = _guarded(source, f"{what} '{ref}'")
    taken = 0
    for index, item in enumerate(source):
        strata = item.strata if isinstance(item, StratifiedItem) else None
        item = item.item if isinstance(item, StratifiedItem) else item
        batch = with_strata(to_batch(item, specs, f"{what} batch {index}"), strata)
        if batch.label is not None and data.metric in CLASS_METRICS:
            check_class_labels(batch.label, f"{what} '{ref}' batch {index}", classes)
        if limit is not None and taken + batch.size > limit:
            batch = batch.head(limit - taken)
        if batch.size:
            yield batch
        taken += batch.size
        if limit is not None and taken >= limit:
            return


def single_rows(batches: Iterable[Batch]) -> Iterator[dict[str, np.ndarray]]:
    """Each sample alone, as a batch of one (with its batch's padding kept)."""
    for batch in batches:
        for row in range(batch.size):
            yield {k: np.asarray(v)[row : row + 1] for k, v in batch.inputs.items()}


def select_rows(batches: Iterable[Batch], chosen: set[int]) -> list[Batch]:
    """The samples whose position in the whole stream is in ``chosen``, batch by batch (shapes kept)."""
    out, start = [], 0
    for batch in batches:
        rows = [i for i in range(batch.size) if start + i in chosen]
        if rows:
            out.append(batch.take(rows))
        start += batch.size
    return out


def sample_ids(batch: Batch) -> list[str]:
    """Each sample's id: the one the data function gave, else a short hash of its content."""
    if batch.ids is not None:
        return list(batch.ids)
    hashes = []
    for i in range(batch.size):
        digest = hashlib.sha1()
        for name in sorted(batch.inputs):
            row = np.ascontiguousarray(batch.inputs[name][i])
            digest.update(name.encode())
            digest.update(row.tobytes())
        hashes.append(digest.hexdigest()[:16])
    return hashes
