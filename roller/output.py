"""Writing a build's artefacts (kernel library, report) without ever leaving half-written files."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from roller.errors import RollerError


class OutputError(RollerError):
    """An output folder or file cannot be written."""


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def read_json_record(path: Path, problem: Callable[[Any], str | None]) -> tuple[Any, str | None]:
    """The JSON a record file holds, where ``problem`` (what is wrong with the data, None if usable) finds it
    usable: ``(data, None)``; ``(None, None)`` where there is no such file; ``(None, why)`` where it cannot be
    read, is not text, is not JSON (truncated or corrupt) or is not usable: the caller warns and carries on
    without it (calibration and fidelity records are never fatal)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except UnicodeDecodeError:
        return None, "is not text (binary garbage: corrupt)"
    try:
        data = json.loads(text)
    except ValueError as e:
        return None, f"is not valid JSON ({e}; truncated or corrupt)"
    why = problem(data)
    return (None, why) if why else (data, None)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a synced temp file in the same folder and an atomic rename:
    readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the file is the user's, as open() would make it
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_out_dir(directory) -> Path:
    """Creates the output folder if needed; OutputError if it is a file or cannot be written."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"--out {out}: cannot create the folder ({e.strerror or e}); give a writable folder") from None
    if not os.access(out, os.W_OK):
        raise OutputError(f"--out {out}: the folder is not writable; give a writable folder")
    return out


def save_build(result, directory) -> dict[str, str]:
    """Saves ``<op>.so`` (the kernel library) and ``<op>.json`` (the report) into ``directory``."""
    out = Path(directory)
    stem = str(result.report.get("op") or result.expr.name)
    lib = out / f"{stem}.so"
    src = result.library
    if src is None or not Path(src).exists():
        from roller.errors import BuildError
        raise BuildError("no kernel library to save: the build was cleaned up; build again with --out")
    atomic_write_bytes(lib, Path(src).read_bytes())
    report = dict(result.report, program=result.program.to_dict(), library=str(lib))
    rep = out / f"{stem}.json"
    atomic_write_bytes(rep, (json.dumps(report, indent=2) + "\n").encode())
    return {"library": str(lib), "report": str(rep)}
