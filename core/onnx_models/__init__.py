"""ONNX model handling for the registry: validation, Horus graph features, and a
built-in model zoo. Django-free (plain onnx/numpy; TVM imported lazily).

Public API::

    from core.onnx_models import (
        OnnxValidationError,                       # .code, .message
        GraphFeatures, compute_features,           # Horus features at any batch size
        ValidatedModel, validate_onnx_bytes, validate_onnx_file, validate_onnx_model,
        ZOO, ZooEntry, build_model, list_models,   # ResNet-18, MobileNetV2, BERT layer, ...
    )
"""

from .errors import ERROR_CODES, OnnxValidationError
from .features import GraphFeatures, compute_features
from .validate import (
    DEFAULT_TARGET,
    ValidatedModel,
    validate_onnx_bytes,
    validate_onnx_file,
    validate_onnx_model,
)
from .zoo import ZOO, ZooEntry, build_model, list_models

__all__ = [
    "ERROR_CODES",
    "OnnxValidationError",
    "GraphFeatures",
    "compute_features",
    "DEFAULT_TARGET",
    "ValidatedModel",
    "validate_onnx_bytes",
    "validate_onnx_file",
    "validate_onnx_model",
    "ZOO",
    "ZooEntry",
    "build_model",
    "list_models",
]
