"""The checks ``quantize-llm`` makes in its first seconds, from the model's header alone, before any weight loads.

The architecture comes from a folder's ``config.json`` (``architectures``) or a GGUF's metadata
(``general.architecture``, read through a memory map: no tensor data is touched). It must be a family of the
architecture table (``architectures.py``), and an AWQ method needs the family's AWQ groups. Anything else is one
``ConfigError`` (exit 2) naming what is supported, instead of a failure after minutes of loading and calibration.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from deploy_opt.llm.architectures import ARCHITECTURES, Architecture, by_gguf_arch, by_hf_architecture
from dopt_common.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

AWQ_METHODS = ("awq", "awq-gptq")


def model_architecture(source: Path) -> tuple[str, Architecture | None]:
    """What the model at ``source`` says it is (``config.json``'s architectures, or the GGUF's
    ``general.architecture``) and the table's entry for it (None: not in the table)."""
    if source.is_dir():
        config = source / "config.json"
        try:
            names = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelError(
                f"'{config}' cannot be read as a model config ({exc}); fix: point at the model folder"
            ) from None
        return ", ".join(map(str, names)) or "(none)", by_hf_architecture([str(name) for name in names])
    from deploy_opt.llm.gguf_header import read_gguf_header

    read_gguf_header(source)  # the counts are checked before a reader trusts them
    import gguf

    field = gguf.GGUFReader(str(source), "r").fields.get("general.architecture")
    arch = "" if field is None else bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return arch or "(none)", by_gguf_arch(arch)


def supported() -> str:
    """The families the table holds, as a user reads them."""
    return ", ".join(f"{arch.family} ({arch.hf_architectures[0]}, GGUF '{arch.gguf_arch}')" for arch in ARCHITECTURES)


def preflight(source: Path, method: str) -> Architecture:
    """The table's entry for the model at ``source``; ConfigError (exit 2) for an architecture the table lacks or
    an AWQ method on a family without AWQ groups."""
    named, arch = model_architecture(source)
    if arch is None:
        raise ConfigError(
            f"model architecture '{named}' of '{source.name}' is not one deploy_opt quantizes; supported: "
            f"{supported()}; fix: convert the model to one of these, or ask for the family to be added"
        )
    if method in AWQ_METHODS and not arch.awq_groups:
        families = ", ".join(a.family for a in ARCHITECTURES if a.awq_groups)
        raise ConfigError(
            f"method {method} needs AWQ scale groups, which {arch.family} has none of in the architecture table; "
            f"fix: use method gptq or rtn (AWQ covers {families})"
        )
    log.info("preflight: %s is %s (%s), method %s", source.name, arch.family, named, method)
    return arch
