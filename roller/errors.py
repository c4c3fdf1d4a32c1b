"""Error types. Every message names what is wrong (file, field, axis, value) and what to do."""


class RollerError(Exception):
    """Base class of every error roller raises on purpose."""


class DeviceSpecError(RollerError):
    """A hardware spec (YAML file or calibration) is missing, malformed or inconsistent."""


class UnsupportedExpressionError(RollerError):
    """The tensor expression is outside what roller can analyse (non-affine index, several reductions...)."""


class InvalidShapeError(RollerError):
    """An operator shape or dtype is invalid (zero, negative, too large, unknown dtype)."""


class BuildError(RollerError):
    """No candidate kernel could be built, verified and timed. ``details`` holds one line per candidate."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


class CalibrationError(RollerError):
    """A calibration run or a calibration cache file is unusable."""


class ModelError(RollerError):
    """A whole model is unusable: the file does not parse, an operator has no importer, an input name or
    shape is wrong or missing."""


class ToolchainError(RollerError):
    """An optional compiler toolchain (the CUDA wheels of the ``cuda`` extra) is missing or failed."""
