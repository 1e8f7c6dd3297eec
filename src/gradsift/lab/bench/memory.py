"""Peak resident memory of a piece of work, from the kernel's own accounting (Linux):
reset the peak-RSS mark (``/proc/self/clear_refs``), run, read ``VmHWM``."""

from __future__ import annotations

__all__ = ["reset_peak_rss", "peak_rss"]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS; return it in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return 1024 * _status_kib("VmRSS")


def peak_rss() -> int:
    return 1024 * _status_kib("VmHWM")
