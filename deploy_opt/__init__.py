"""deploy_opt: PyTorch → verified INT8 deployment artifacts that behave the same on every backend.

The public API, loaded lazily so that ``import deploy_opt`` stays light::

    from deploy_opt import load_build_config, run_build
    config, profile = load_build_config("my_build.yaml")
    result = run_build(config, profile, Path("reports"))

Where things live: ``config/`` (YAML → frozen dataclasses, profiles), ``data/`` (the data sources and batches)
and ``evaluation/`` (metrics and evaluation), shared by every stage, ``stages/`` (one module per stage),
``pipeline/`` (their composition), ``analysis/`` (sensitivity, compare, compat, align), ``report/`` (gates, build
records, plots), ``cli/``, ``backend_tables/`` (the operator tables compat reads), and the ``llm/``, ``train/``
and ``demo/`` companions.
"""

from __future__ import annotations

from dopt_common.lazy import lazy_exports

__version__ = "0.1.0"

_PUBLIC = {
    "run_build": "deploy_opt.pipeline.build",
    "BuildResult": "deploy_opt.pipeline.build",
    "load_build_config": "deploy_opt.config.profiles",
    "BuildConfig": "deploy_opt.config.build",
}
__all__ = ["__version__", *_PUBLIC]

__getattr__, __dir__ = lazy_exports("deploy_opt", _PUBLIC, __all__)
