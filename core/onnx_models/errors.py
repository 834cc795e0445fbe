"""The one exception the ONNX model layer raises for a model it refuses.

Every refusal carries a stable machine ``code`` (the API returns it and the
dashboard keys its help text on it) and a human ``message`` that says what is
wrong and how to fix it. ``str(err)`` is the message, so the error can be shown
to a user as is.
"""

from __future__ import annotations

__all__ = ["OnnxValidationError", "ERROR_CODES"]

#: Every code :class:`OnnxValidationError` is raised with, and what it means.
ERROR_CODES: dict[str, str] = {
    "bad_extension": "the file name does not end in .onnx",
    "too_large": "the file is larger than the upload cap",
    "empty": "the file has no bytes",
    "not_protobuf": "the bytes are not an ONNX ModelProto",
    "truncated": "the file is an ONNX model cut short (incomplete upload or copy)",
    "external_data": "a tensor refers to an external data file",
    "missing_input_shape": "an input has no shape or a symbolic non-batch dimension",
    "absurd_dimension": "a dimension is <= 0 or larger than the allowed maximum",
    "checker_failed": "onnx.checker refused the model",
    "shape_inference_failed": "ONNX shape inference failed",
    "tensor_too_large": "a tensor has more elements than the allowed maximum",
    "too_much_activation_memory": "the intermediate tensors together need more memory than allowed",
    "unsupported_op": "an operator has no converter in TVM's Relax ONNX frontend",
    "too_many_flops": "the model needs more compute (FLOPs plus data copied) than the allowed maximum",
    "tvm_import_failed": "TVM could not import (or extract tuning tasks from) the model",
    "validation_aborted": "validation was stopped at its memory, CPU-time or wall-clock limit, or the validator crashed",
    "validation_failed": "validation of a large upload failed with an internal error (set by the platform)",
}


class OnnxValidationError(ValueError):
    """A model was refused. ``code`` is machine readable, ``message`` is for people.

    >>> err = OnnxValidationError("too_large", "The file is 3.0 MB; the cap is 1.0 MB.")
    >>> err.code, str(err)
    ('too_large', 'The file is 3.0 MB; the cap is 1.0 MB.')
    """

    code: str
    message: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"OnnxValidationError(code={self.code!r}, message={self.message!r})"

    def to_dict(self) -> dict[str, str]:
        """JSON-safe form, e.g. for an API error body."""
        return {"code": self.code, "message": self.message}
