"""Training-time measurements: the optimizers and their state codes, QAT's optimizers, pruning."""
