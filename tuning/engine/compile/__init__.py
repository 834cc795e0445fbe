"""ONNX -> Relax -> tasks -> compiled module: the one pipeline, its passes, targets and their schema."""
