"""The INT8 build's costs: calibration, conversion, dynamic INT8, latency, sensitivity proxies, faults."""
