"""What both demo jobs' reports share: the device line, saved figures, estimates as value±error."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["device_description", "format_estimate", "save_figure"]


def device_description(device: str) -> str:
    if device == "cuda":
        from steadystep.cuda.runtime import require_cuda

        name = getattr(require_cuda().get_current_device(), "name", b"Numba CUDA simulator")
        return f"cuda: {name.decode() if isinstance(name, bytes) else name}"
    return f"cpu: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} logical cores".replace(" ,", ",")


def save_figure(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def format_estimate(estimate: dict) -> str:
    """value±error with the error to one significant digit and the value to the same place
    (0.0022±0.0007, 38±7), as an estimate is reported; "—" where undefined."""
    value, error = estimate["value"], estimate.get("standard_error")
    if value is None:
        return "—"
    if not error or not math.isfinite(error) or not math.isfinite(value):
        return f"{value:.3g}"
    place = math.floor(math.log10(error))
    if not -6 <= place <= 5:
        return f"{value:.2g}±{error:.1g}"
    decimals = max(0, -place)
    return f"{value:.{decimals}f}±{round(error, -place):.{decimals}f}"
