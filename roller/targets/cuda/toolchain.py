"""The offline CUDA toolchain from PyPI (``pip install -e ".[cuda]"``): CUDA source -> PTX with NVRTC, PTX ->
cubin with ``ptxas -v`` and its resources (registers, spills, shared memory) as data (or source -> cubin
with NVRTC alone). No system CUDA and no GPU needed.

TVM compiles CUDA through NVRTC (``tvm.support.nvcc.compile_cuda``) and looks for ``cuda_runtime.h`` and the
CCCL headers (``cuda/std/...``) under ``$CUDA_PATH/include``. The wheels keep them in three folders
(``nvidia/cuda_runtime/include``, ``nvidia/cuda_cccl/include``, and ``nvidia/cuda_nvcc/include`` with
``crt/mma.h``, which tensor-core (WMMA) kernels need): ``include_root`` gathers them into one folder of symlinks in roller's per-user cache and points ``CUDA_PATH`` at it (unless ``CUDA_PATH`` already
holds a CUDA installation). ``ptxas`` comes from ``nvidia-cuda-nvcc-cu12``.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from roller.errors import ToolchainError

INSTALL_HINT = 'install the CUDA toolchain extra: pip install -e ".[cuda]"'


def _nvidia_dir(package: str) -> Path:
    """The folder of one ``nvidia-*`` wheel's files (``nvidia/<package>``), or ToolchainError."""
    try:
        import nvidia
    except ImportError:
        raise ToolchainError(f"the NVIDIA CUDA wheels are not installed; {INSTALL_HINT}") from None
    for root in nvidia.__path__:
        path = Path(root) / package
        if path.is_dir():
            return path
    raise ToolchainError(f"the wheel providing nvidia/{package} is not installed; {INSTALL_HINT}")


def missing() -> str | None:
    """Why the toolchain cannot run here (one line), or None when every part is installed."""
    try:
        for package in ("cuda_runtime", "cuda_cccl", "cuda_nvrtc"):
            _nvidia_dir(package)
        ptxas_path()
    except ToolchainError as e:
        return str(e)
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings.nvrtc") is None:
        return f"cuda-bindings (TVM's NVRTC path) is not installed; {INSTALL_HINT}"
    return None


def _cache_root() -> Path:
    from roller.userdirs import cache_dir

    return cache_dir() / "cuda"


def include_root() -> Path:
    """A folder whose ``include/`` holds the CUDA runtime and CCCL headers; sets ``CUDA_PATH`` to it.

    The symlinks are (re)made on every call, so a moved or upgraded wheel is followed; an existing
    ``CUDA_PATH`` with ``include/cuda_runtime.h`` (a real CUDA installation) is left as it is.
    """
    current = os.environ.get("CUDA_PATH")
    if current and (Path(current) / "include" / "cuda_runtime.h").is_file():
        return Path(current)
    root = _cache_root()
    include = root / "include"
    include.mkdir(parents=True, exist_ok=True)
    # cuda_nvcc's include/ holds crt/ (crt/mma.h: the WMMA API that tensor-core kernels include via mma.h)
    for package in ("cuda_runtime", "cuda_cccl", "cuda_nvcc"):
        for src in (_nvidia_dir(package) / "include").iterdir():
            if src.name.startswith("__"):  # the wheel's __init__.py / __pycache__
                continue
            link = include / src.name
            if link.is_symlink() or link.exists():
                if link.is_symlink() and os.readlink(link) == str(src):
                    continue
                link.unlink()
            link.symlink_to(src)
    os.environ["CUDA_PATH"] = str(root)
    return root


def _compile(source: str, arch: str, target_format: str) -> bytes:
    reason = missing()
    if reason:
        raise ToolchainError(reason)
    include_root()
    from tvm.support import nvcc

    try:
        return bytes(nvcc.compile_cuda(source, target_format=target_format, arch=arch))
    except RuntimeError as e:
        raise ToolchainError(f"NVRTC could not compile the CUDA source for {arch}: {e}") from None


def to_ptx(source: str, arch: str) -> str:
    """PTX text of a CUDA source for ``arch`` (e.g. ``sm_80``), through NVRTC."""
    return _compile(source, arch, "ptx").decode().rstrip("\0")


def to_cubin(source: str, arch: str) -> bytes:
    """The cubin (an ELF) of a CUDA source for ``arch``, through NVRTC."""
    return _compile(source, arch, "cubin")


def ptxas_path() -> Path:
    """The ``ptxas`` of ``nvidia-cuda-nvcc-cu12``."""
    path = _nvidia_dir("cuda_nvcc") / "bin" / "ptxas"
    if not path.is_file():
        raise ToolchainError(f"{path} is missing; {INSTALL_HINT}")
    return path


@dataclass(frozen=True)
class KernelResources:
    """What ``ptxas -v`` reports for one kernel: registers per thread, bytes spilled to local memory
    (stores / loads), stack frame bytes, static shared memory bytes per block, barriers used."""

    kernel: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int
    barriers: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    def to_dict(self) -> dict:
        return asdict(self)


_FUNCTION = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas(text: str) -> list[KernelResources]:
    """The per-kernel resources in the output of ``ptxas -v`` (every entry function, in order)."""
    out: list[KernelResources] = []
    parts = _FUNCTION.split(text)
    for name, body in zip(parts[1::2], parts[2::2]):
        frame, used = _FRAME.search(body), _USED.search(body)
        if not used:
            raise ToolchainError(f"ptxas -v printed no register count for kernel {name!r}:\n{body.strip()}")
        smem, barriers = _SMEM.search(body), _BARRIERS.search(body)
        out.append(KernelResources(
            kernel=name, registers=int(used.group(1)),
            spill_store_bytes=int(frame.group(2)) if frame else 0, spill_load_bytes=int(frame.group(3)) if frame else 0,
            stack_bytes=int(frame.group(1)) if frame else 0, shared_bytes=int(smem.group(1)) if smem else 0,
            barriers=int(barriers.group(1)) if barriers else 0))
    return out


def assemble(ptx: str, arch: str) -> tuple[bytes, list[KernelResources]]:
    """Runs ``ptxas -arch=ARCH -v`` on PTX text: the cubin, and each kernel's resources."""
    exe = ptxas_path()
    with tempfile.TemporaryDirectory(prefix="roller-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        proc = subprocess.run([str(exe), f"-arch={arch}", "-v", str(src), "-o", str(out)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise ToolchainError(f"ptxas -arch={arch} failed: {(proc.stderr or proc.stdout).strip()[:2000]}")
        return out.read_bytes(), parse_ptxas(proc.stdout + proc.stderr)
