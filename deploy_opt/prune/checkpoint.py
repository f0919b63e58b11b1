"""``pruned.pt``: the pruned, distilled weights plus what it takes to rebuild the smaller model from the factory.

The file is a plain dict (``torch.load(..., weights_only=True)`` reads it): the factory reference, each changed
module's new sizes (``out_features``, ``out_channels``, ``groups``, head counts, ...) and the state dict.
:func:`load_pruned` calls the factory, resizes those modules and loads the weights strictly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deploy_opt.data.sources import call_user, resolve_callable
from dopt_common.errors import CheckpointError

FORMAT = "deploy_opt.pruned/1"
SIZE_ATTRIBUTES = (
    "in_features",
    "out_features",
    "in_channels",
    "out_channels",
    "groups",
    "num_features",
    "normalized_shape",
    "num_attention_heads",
    "num_heads",
    "n_heads",
    "n_head",
    "heads",
    "all_head_size",
    "inner_dim",
    "embed_dim",
)


def changed_sizes(original: Any, pruned: Any) -> dict[str, dict[str, Any]]:
    """module name → the size attributes whose value pruning changed."""
    before = dict(original.named_modules())
    changes = {}
    for name, module in pruned.named_modules():
        old = before.get(name)
        diff = {
            attr: _plain(getattr(module, attr))
            for attr in SIZE_ATTRIBUTES
            if old is not None and hasattr(module, attr) and getattr(module, attr) != getattr(old, attr, None)
        }
        if diff:
            changes[name] = diff
    return changes


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def save_pruned(path: Path, factory: str, original: Any, pruned: Any, record: dict[str, Any]) -> None:
    """Write ``pruned.pt`` (weights_only-loadable)."""
    import torch

    payload = {
        "format": FORMAT,
        "factory": factory,
        "sizes": changed_sizes(original, pruned),
        "cuts": record,
        "state_dict": {k: v.detach().clone() for k, v in pruned.state_dict().items()},
    }
    torch.save(payload, path)


def load_pruned(path: str | Path, base_dir: str | Path = ".") -> Any:
    """The pruned model, rebuilt: the factory's model resized as recorded, with the saved weights (eval mode)."""
    import torch

    try:
        payload = torch.load(str(path), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"pruned checkpoint '{path}' cannot be read ({exc}); fix: rebuild with prune") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a deploy_opt pruned checkpoint (format {FORMAT})")
    factory = str(payload["factory"])
    model = call_user(resolve_callable(factory, base_dir, "pruned.pt factory"), f"pruned.pt factory '{factory}'")
    modules = dict(model.named_modules())
    for name, sizes in payload["sizes"].items():
        if name not in modules:
            raise CheckpointError(f"'{path}': the factory's model has no module '{name}'; is it the same factory?")
        for attr, value in sizes.items():
            setattr(modules[name], attr, tuple(value) if isinstance(value, list) else value)
    _resize_tensors(model, payload["state_dict"])
    model.load_state_dict(payload["state_dict"], strict=True)
    return model.eval()


def _resize_tensors(model: Any, state: dict[str, Any]) -> None:
    """Replace each parameter or buffer whose saved shape differs with an empty tensor of that shape."""
    import torch

    modules = dict(model.named_modules())
    for key, tensor in state.items():
        owner, _, leaf = key.rpartition(".")
        module = modules.get(owner)
        if module is None:
            continue
        if leaf in module._parameters and module._parameters[leaf] is not None:
            if module._parameters[leaf].shape != tensor.shape:
                grad = module._parameters[leaf].requires_grad
                module._parameters[leaf] = torch.nn.Parameter(torch.empty_like(tensor), requires_grad=grad)
        elif leaf in module._buffers and module._buffers[leaf] is not None:
            if module._buffers[leaf].shape != tensor.shape:
                module._buffers[leaf] = torch.empty_like(tensor)
