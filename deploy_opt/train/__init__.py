"""The training companion: int8 block-wise optimizers, schedules, memory estimates and the training loop."""
