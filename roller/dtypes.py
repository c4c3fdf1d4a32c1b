"""Element types roller knows, and their sizes. One table so every module agrees."""
from roller.errors import InvalidShapeError

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Size in bytes of one element of ``dtype``; InvalidShapeError names the known types otherwise."""
    try:
        return DTYPE_BYTES[str(dtype)]
    except KeyError:
        known = ", ".join(DTYPE_BYTES)
        raise InvalidShapeError(f"unknown dtype {dtype!r}: use one of {known}") from None
