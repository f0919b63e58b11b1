"""What may be pruned in a torch model, and the pruning itself (torch-pruning's dependency graph, DepGraph).

DepGraph groups every layer whose channels must shrink together (a residual add ties the convs that feed it, a
depthwise conv ties its input to its output), so shapes stay consistent. Each group is classified by its root
layer: ``heads`` (the query, key and value projections of an attention module, pruned as whole heads), ``ffn``
(a Linear's hidden width that touches no normalisation or embedding), ``channels`` (a conv's output channels),
or ``residual`` (a transformer's hidden size: never pruned). The model's output layer is never pruned.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy_opt.config.prune import PruneConfig
from dopt_common.deps import require
from dopt_common.errors import ModelError

log = logging.getLogger(__name__)
HEAD_ATTRIBUTES = ("num_attention_heads", "num_heads", "n_heads", "n_head", "heads")
QKV_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"), ("q", "k", "v"))
WIDTH_ATTRIBUTES = ("all_head_size", "inner_dim")  # set to the query projection's new width after head pruning


@dataclass(frozen=True)
class Attention:
    """An attention module: where its head count lives and its query, key and value projections."""

    name: str
    module: Any
    attribute: str
    qkv: tuple[Any, ...]
    heads: int


@dataclass(frozen=True)
class LayerCut:
    """One pruned layer: what it is and its width (channels, neurons or heads) before and after."""

    name: str
    kind: str
    before: int
    after: int

    @property
    def ratio(self) -> float:
        """The share removed."""
        return 1.0 - self.after / self.before


def torch_pruning() -> Any:
    """The torch-pruning package, or a one-line error naming the pip extra."""
    return require("torch_pruning", purpose="prune (structured pruning)", extra="prune")


def find_attention(model: Any) -> list[Attention]:
    """Modules with an integer head count and query/key/value Linear layers (HF-style and plain-torch names)."""
    import torch

    found, claimed = [], set()
    for name, module in model.named_modules():
        attribute = next((a for a in HEAD_ATTRIBUTES if type(getattr(module, a, None)) is int), None)
        if attribute is None:
            continue
        heads = getattr(module, attribute)
        children = dict(module.named_modules())
        for names in QKV_NAMES:
            paths = [next((p for p in children if p == n or p.endswith("." + n)), None) for n in names]
            layers = tuple(children[p] for p in paths if p is not None)
            if len(layers) == 3 and all(isinstance(m, torch.nn.Linear) for m in layers):
                if all(m.out_features % heads == 0 for m in layers) and not claimed & {id(m) for m in layers}:
                    claimed |= {id(m) for m in layers}
                    found.append(Attention(name, module, attribute, layers, heads))
                break
    return found


def output_layers(model: Any, example: Sequence[Any]) -> set[int]:
    """ids of the prunable layers whose output is the model's output, and of the last one called."""
    import torch

    called: list[tuple[Any, Any]] = []
    hooks = [
        m.register_forward_hook(lambda mod, _in, out: called.append((mod, out)))
        for m in model.modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.modules.conv._ConvNd))
    ]
    try:
        with torch.no_grad():
            result = model(*example)
    finally:
        for hook in hooks:
            hook.remove()
    results = result if isinstance(result, (tuple, list)) else [result]
    last = {id(called[-1][0])} if called else set()
    return last | {id(m) for m, out in called if any(out is r for r in results)}


def classify_groups(model: Any, example: Sequence[Any], attention: list[Attention]) -> dict[int, tuple[str, str]]:
    """id(root layer) → (kind, module name) for every dependency group of the model."""
    import torch

    tp = torch_pruning()
    names = {id(m): n for n, m in model.named_modules()}
    qkv = {id(layer) for a in attention for layer in a.qkv}
    graph = tp.DependencyGraph().build_dependency(model, example_inputs=tuple(example))
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.Embedding, torch.nn.RMSNorm)
    kinds = {}
    for group in graph.get_all_groups(root_module_types=[torch.nn.modules.conv._ConvNd, torch.nn.Linear]):
        root = group[0].dep.target.module
        modules = [item.dep.target.module for item in group]
        if id(root) in qkv:
            kind = "heads"
        elif any(isinstance(m, norms) for m in modules):
            kind = "residual"
        elif any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in modules):
            kind = "channels"
        else:
            kind = "ffn"
        kinds[id(root)] = (kind, names.get(id(root), "?"))
    return kinds


def prune_structure(
    model: Any, example: Sequence[Any], config: PruneConfig, importance: Any
) -> tuple[list[LayerCut], list[Attention]]:
    """Prune ``model`` in place as ``config`` says; the per-layer cuts and the attention modules found."""
    import torch

    tp = torch_pruning()
    found = find_attention(model)
    attention = found if "heads" in config.targets and config.heads > 0 else []
    kinds = classify_groups(model, example, attention)
    keep_out = output_layers(model, example)
    targeted = set(config.targets) - ({"heads"} if not attention else set())
    layers = {id(m): m for m in model.modules()}
    ignored = [layers[i] for i, (kind, _) in kinds.items() if kind not in targeted or i in keep_out]
    ignored += [layer for a in found if a not in attention for layer in a.qkv]
    prunable = [name for i, (kind, name) in kinds.items() if kind in targeted and i not in keep_out]
    if not prunable:
        found = ", ".join(sorted({k for k, _ in kinds.values()})) or "none"
        raise ModelError(
            f"prune.targets {list(config.targets)} matches no prunable layer in this model (groups found: {found}); "
            "fix: choose other targets, or set prune.ratio: 0"
        )
    before = _widths(model, kinds)
    head_dims = [a.qkv[0].out_features // a.heads for a in attention]
    pruner = _pruner_class(tp)(
        model,
        tuple(example),
        importance,
        global_pruning=config.per_layer == "auto",
        pruning_ratio=config.ratio,
        max_pruning_ratio=config.max_layer_ratio,
        ignored_layers=ignored,
        round_to=config.round_to,
        # torch-pruning visits a group's heads only when its channel ratio is positive; the heads' own ratio is
        # head_pruning_ratio (prune_head_dims=False: no channel inside a head is cut).
        pruning_ratio_dict={a.qkv: config.heads for a in attention} or None,
        num_heads={layer: a.heads for a in attention for layer in a.qkv},
        prune_num_heads=bool(attention),
        prune_head_dims=False,
        head_pruning_ratio=config.heads if attention else 0.0,
    )
    with torch.no_grad():
        for group in pruner.step(interactive=True):
            group.prune()
    for a, head_dim in zip(attention, head_dims, strict=True):
        setattr(a.module, a.attribute, a.qkv[0].out_features // head_dim)
        for width in WIDTH_ATTRIBUTES:
            if type(getattr(a.module, width, None)) is int:
                setattr(a.module, width, a.qkv[0].out_features)
    after = _widths(model, kinds)
    cuts = [LayerCut(kinds[i][1], kinds[i][0], before[i], after[i]) for i in before if after[i] != before[i]]
    cuts = [c for c in cuts if c.kind != "heads"]
    cuts += [LayerCut(a.name, "heads", a.heads, getattr(a.module, a.attribute)) for a in attention]
    return cuts, attention


def _pruner_class(tp: Any) -> type:
    """torch-pruning's MetaPruner, with ``round_to`` rounding each kept width to the nearest multiple (not down)."""

    class NearestRoundingPruner(tp.pruner.MetaPruner):
        def _round_to(self, n_pruned: int, current_channels: int, round_to: int) -> int:
            kept = max(round_to, round_to * round((current_channels - n_pruned) / round_to))
            return max(0, current_channels - min(kept, current_channels))

    return NearestRoundingPruner


def _widths(model: Any, kinds: dict[int, tuple[str, str]]) -> dict[int, int]:
    """id(root layer) → its output width (channels or neurons)."""
    return {
        id(m): int(getattr(m, "out_features", None) or getattr(m, "out_channels", 0))
        for m in model.modules()
        if id(m) in kinds
    }
