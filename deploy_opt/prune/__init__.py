"""Structured pruning of torch models (torch-pruning's DepGraph) and distillation from the unpruned model."""
