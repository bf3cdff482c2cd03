"""The frontends wing: which reader takes a model file (ONNX, TFLite, PyTorch) and their import stages."""
