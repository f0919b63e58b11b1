"""A Hugging Face ``datasets`` folder written with ``save_to_disk`` as a data source (one split).

Columns are matched to the model by name: columns named as its inputs are arrays; else a ``text`` column is
tokenized (``data.tokenizer``) and an ``image`` column preprocessed (``data.preprocess``) as the other file sources
do; a ``label`` or ``labels`` column gives the labels. A ``DatasetDict`` folder (several splits) names its splits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.evaluation.file_rows import Item, StratifiedItem, cast_array
from deploy_opt.evaluation.images import preprocess_image
from deploy_opt.evaluation.text_files import TOKEN_INPUTS, load_tokenizer, text_labels, tokenize
from dopt_common.deps import require
from dopt_common.errors import InputError

LABEL_COLUMNS = ("label", "labels")


def dataset_items(
    path: Path, specs: tuple[InputSpec, ...], data: DataConfig, tokenizer_dir: str | None, what: str
) -> Iterator[Item | StratifiedItem]:
    """The folder's rows in batches of ``data.batch_size``, as (inputs, label) items."""
    splits_file = path / "dataset_dict.json"
    if splits_file.is_file():
        splits = json.loads(splits_file.read_text(encoding="utf-8")).get("splits", [])
        raise InputError(f"{what} '{path}' holds the splits {splits}; fix: point at one, e.g. '{path}/{splits[0]}'")
    datasets = require("datasets", purpose="datasets folders (save_to_disk)", extra="datasets")
    table = datasets.load_from_disk(str(path))
    columns = list(table.column_names)
    label = next((c for c in LABEL_COLUMNS if c in columns), None)
    if data.strata is not None and data.strata not in columns:
        raise InputError(f"{what} '{path}' has no column '{data.strata}' (data.strata); its columns: {columns}")
    convert = _converter(columns, specs, data, tokenizer_dir, path, what)
    for batch in table.iter(batch_size=data.batch_size):
        inputs = convert(batch)
        item: Item = (inputs, text_labels(inputs, None if label is None else np.asarray(batch[label]), data.metric))
        yield item if data.strata is None else StratifiedItem(item, list(batch[data.strata]))


def _converter(
    columns: list[str], specs: tuple[InputSpec, ...], data: DataConfig, tokenizer_dir: str | None, path: Path, what: str
) -> Any:
    names = [s.name for s in specs]
    if all(n in columns for n in names):
        return lambda batch: {s.name: cast_array(np.asarray(batch[s.name]), s, path.name, what) for s in specs}
    if "text" in columns and all(n in TOKEN_INPUTS for n in names):
        tokenizer = load_tokenizer(tokenizer_dir, data.max_length, what)
        return lambda batch: tokenize(tokenizer, [str(t) for t in batch["text"]], specs)
    if "image" in columns and len(specs) == 1:
        spec, pre = specs[0], data.preprocess
        return lambda batch: {
            spec.name: np.stack(
                [preprocess_image(im, path / f"row {i}", spec, pre, what) for i, im in enumerate(batch["image"])]
            )
        }
    raise InputError(
        f"{what} '{path}' has columns {columns}; the model takes {names}: name columns after the inputs, or give a "
        "'text' column (token inputs) or an 'image' column (one image input)"
    )
