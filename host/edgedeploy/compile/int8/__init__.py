"""The INT8 wing: calibration data and scoring, Q/DQ quantization, its exact reference, and the rewrite of a Q/DQ
graph into integer arithmetic (the int8-rewrite stage)."""
