"""What machine a benchmark ran on, for its results table."""

from __future__ import annotations

import os
import platform

__all__ = ["describe"]


def describe(**versions: str) -> dict[str, str]:
    """CPU model, core count and Python version, plus the ``versions`` given."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        **versions,
    }
