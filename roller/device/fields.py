"""Reading a YAML spec's fields: typed getters whose errors name the file, the field and what it should be,
and sizes written as bytes or ``32KiB`` / ``2M``."""
from __future__ import annotations

import re
from typing import Any, Mapping

from roller.errors import DeviceSpecError


class _Fields:
    """Reads typed fields out of one mapping of a spec, naming file and path in every error."""

    def __init__(self, data: Any, where: str, path: str):
        if not isinstance(data, Mapping):
            raise DeviceSpecError(f"{where}: {path or 'top level'}: expected a mapping, got {_show(data)}")
        self.data, self.where, self.path = data, where, path

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, expected: str) -> DeviceSpecError:
        val = self.data.get(key, None)
        got = "nothing (the field is missing)" if key not in self.data else _show(val)
        return DeviceSpecError(f"{self.where}: {self._name(key)}: expected {expected}, got {got}")

    def get(self, key: str, kind: str, default: Any = ..., positive: bool = True) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.fail(key, _KIND_TEXT[kind])
            return default
        val = self.data[key]
        if kind == "int":
            if isinstance(val, bool) or not isinstance(val, int) or (positive and val <= 0):
                raise self.fail(key, _KIND_TEXT[kind])
        elif kind == "float":
            if isinstance(val, bool) or not isinstance(val, (int, float)) or (positive and not val > 0):
                raise self.fail(key, _KIND_TEXT[kind])
            val = float(val)
        elif kind == "fraction":
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 < val <= 1:
                raise self.fail(key, _KIND_TEXT[kind])
            val = float(val)
        elif kind == "share":
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 1:
                raise self.fail(key, _KIND_TEXT[kind])
            val = float(val)
        elif kind == "str":
            if not isinstance(val, str) or not val:
                raise self.fail(key, _KIND_TEXT[kind])
        elif kind == "bool":
            if not isinstance(val, bool):
                raise self.fail(key, _KIND_TEXT[kind])
        elif kind == "map":
            if not isinstance(val, Mapping):
                raise self.fail(key, _KIND_TEXT[kind])
        elif kind == "list":
            if not isinstance(val, list) or not val:
                raise self.fail(key, _KIND_TEXT[kind])
        return val

    def sub(self, key: str) -> "_Fields":
        return _Fields(self.get(key, "map"), self.where, self._name(key))

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(set(map(str, self.data)) - allowed)
        if extra:
            raise DeviceSpecError(f"{self.where}: {self.path or 'top level'}: unknown field(s) {', '.join(extra)}; "
                                  f"allowed: {', '.join(sorted(allowed))}")


_KIND_TEXT = {
    "int": "a positive integer", "float": "a positive number", "fraction": "a number in (0, 1]",
    "share": "a number in [0, 1]",
    "str": "a non-empty string", "bool": "true or false", "map": "a mapping", "list": "a non-empty list",
}


def _show(val: Any) -> str:
    text = repr(val)
    return text if len(text) < 60 else text[:57] + "..."


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?)?\s*$", re.IGNORECASE)


def parse_size(value: Any) -> int | None:
    """Bytes from an int or a string like ``48K``, ``2MiB``, ``105 MB`` (binary units); None if invalid."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            mult = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[(m.group(2) or "")[:1].lower()]
            n = int(m.group(1)) * mult
            return n if n > 0 else None
    return None
