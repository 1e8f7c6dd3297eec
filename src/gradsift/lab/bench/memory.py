"""Peak resident memory of a piece of work, from the kernel's own accounting (Linux):
reset the peak-RSS mark (``/proc/self/clear_refs``), run, read ``VmHWM``."""

from __future__ import annotations

__all__ = ["reset_peak_rss", "peak_rss", "peak_and_current_rss"]


def _status_bytes(*fields: str) -> list[int]:
    """``fields`` of ``/proc/self/status`` in bytes, from one read (one snapshot:
    the kernel computes ``VmHWM`` as at least the ``VmRSS`` it prints beside it)."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in fields:
                found[name] = 1024 * int(line.split()[1])
    missing = [name for name in fields if name not in found]
    if missing:
        raise RuntimeError(f"{missing} not in /proc/self/status")
    return [found[name] for name in fields]


def reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS; return it in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")[0]


def peak_rss() -> int:
    return _status_bytes("VmHWM")[0]


def peak_and_current_rss() -> tuple[int, int]:
    """``(peak, current)`` resident bytes from one snapshot, so ``peak >= current``
    (two reads could see the resident set grow in between)."""
    peak, now = _status_bytes("VmHWM", "VmRSS")
    return peak, now
