"""TensorRT: the engine built from the Q/DQ model (engine, profile, runner) and the legacy (<= 10) calibration cache."""
