"""TensorRT: the engine built from the Q/DQ model, the legacy (<= 10) calibration cache and calibrator."""
