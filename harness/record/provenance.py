"""Where a measurement came from: the code (git commit, branch, uncommitted changes), the
hardware, the weight precision and the versions of the software around it.

A number in the history is only useful if it can be traced back to what produced it, so the
sweep records these with every run; `regress` uses the same git helper to find merge bases.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from k2bench import __version__

# Distributions whose versions change what a run measures (client and, when local, server side).
VERSIONED_PACKAGES = ("aiohttp", "uvloop", "numpy", "torch", "triton", "vllm", "sglang")


def git(repo: str | None, *args: str) -> str | None:
    """Stripped output of ``git ARGS`` in ``repo`` (None: the current directory), or None when git is
    missing, times out or fails (not a checkout, unknown revision)."""
    try:
        out = subprocess.run(["git", *args], cwd=repo or None, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(repo: str | None = None) -> str | None:
    return git(repo, "rev-parse", "HEAD") or None


def git_branch(repo: str | None = None) -> str | None:
    """The checked-out branch; None on a detached HEAD or outside a checkout."""
    branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    return None if not branch or branch == "HEAD" else branch


def git_dirty(repo: str | None = None) -> bool | None:
    """Whether tracked files differ from HEAD (the measured code is then not exactly the commit);
    None outside a checkout."""
    out = git(repo, "status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)


def _smi(argv: list[str]) -> list[str]:
    """The non-empty output lines of a GPU tool (nvidia-smi, rocm-smi), or [] when it is missing or fails."""
    if not shutil.which(argv[0]):
        return []
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def gpus() -> list[dict]:
    """Each visible GPU's name (and, on NVIDIA, its maximum SM clock and driver version)."""
    found = []
    for line in _smi(["nvidia-smi", "--query-gpu=name,clocks.max.sm,driver_version", "--format=csv,noheader,nounits"]):
        name, _, rest = line.partition(",")
        clock, _, driver = rest.partition(",")
        found.append({"name": name.strip(), "max_sm_mhz": clock.strip() or None, "driver": driver.strip() or None})
    if not found:  # rocm-smi's CSV: a header, then one line per card
        found = [{"name": line.split(",")[-1].strip()} for line in _smi(["rocm-smi", "--showproductname", "--csv"])[1:]]
    return found


def detect_hardware() -> str:
    """A short name for what the server runs on: the first GPU's name, else the CPU."""
    for argv in (["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                 ["rocm-smi", "--showproductname", "--csv"]):
        lines = _smi(argv)
        if lines:
            return lines[-1] if argv[0] == "rocm-smi" else lines[0]
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}"


def precision_of(model_dir: Path) -> str | None:
    """The weight format a Hugging Face model folder declares (mxfp4, nvfp4, fp8 or its dtype)."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    q = json.dumps(cfg.get("quantization_config") or {}).lower()
    if "nvfp4" in q:  # ModelOpt / compressed-tensors NVFP4: not the same format as MXFP4
        return "nvfp4"
    if "fp4" in q:  # Quark (Kimi-K2.5) and gpt-oss MXFP4
        return "mxfp4"
    if "fp8" in q:  # e.g. quant_method "fp8": the weights are not in torch_dtype
        return "fp8"
    return str(cfg.get("torch_dtype") or "bf16")


def versions() -> dict[str, str]:
    """k2bench's, Python's and the installed versions of VERSIONED_PACKAGES, read from package
    metadata so that nothing heavy (torch) is imported to learn them."""
    found = {"k2bench": __version__, "python": sys.version.split()[0]}
    for name in VERSIONED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def device_label(hardware: str | None, count: int) -> str:
    """'1 CPU' or '4 GPU(s)': what tok/s/GPU was divided by, named truthfully."""
    if (hardware or "").startswith("cpu"):
        return f"{count} CPU" + ("s" if count > 1 else "")
    return f"{count} GPU(s)"
