"""deploy_opt: PyTorch → verified INT8 deployment artifacts that behave the same on every backend."""

__version__ = "0.1.0"
