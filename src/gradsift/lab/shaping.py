"""Limited bandwidth on one machine: run a function inside a private network namespace
whose loopback is rate-limited, ``unshare --net`` plus
``tc qdisc replace dev lo root tbf rate RATE burst 512kb latency 100ms``.

Every rank of a run started inside talks over 127.0.0.1, so all of its traffic passes
the shaped loopback (both directions share it). Needs root, ``unshare`` and ``tc``;
without them this says so in one line (a ``ValueError``), never runs unshaped.

``python -m gradsift.lab.shaping RATE MODULE:FUNCTION KWARGS_JSON OUT_JSON`` is the
entry point inside the namespace.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gradsift.lab.atomic import atomic_write_json, read_json

__all__ = ["check_rate", "rate_gbit", "run_shaped", "loopback_bytes", "send_bytes"]

_RATE = re.compile(r"^\d+(\.\d+)?[kmg]?bit$")
ENV = "GRADSIFT_SHAPED_RATE"  # set inside the namespace


def check_rate(rate: str) -> str:
    """A ``tc`` rate such as ``100mbit``, ``1gbit``, ``10gbit``."""
    if not isinstance(rate, str) or not _RATE.match(rate):
        raise ValueError(f"bandwidth must be a tc rate like 100mbit, 1gbit or 10gbit, got {rate!r}")
    return rate


def rate_gbit(rate: str) -> float:
    """``rate`` in Gbit/s: ``rate_gbit("100mbit") == 0.1``."""
    number, unit = re.match(r"^(\d+(?:\.\d+)?)([kmg]?)bit$", check_rate(rate)).groups()
    return float(number) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0}[unit]


def _check_tools() -> None:
    missing = [tool for tool in ("unshare", "tc", "ip") if shutil.which(tool) is None]
    if missing:
        raise ValueError(
            f"cannot emulate bandwidth: {', '.join(missing)} not found "
            "(Debian: apt install iproute2 util-linux)"
        )
    if os.geteuid() != 0:
        raise ValueError("cannot emulate bandwidth: network namespaces and tc need root")


def run_shaped(rate: str, function: str, kwargs: dict, timeout_s: float = 3600):
    """``function(**kwargs)`` (``"module:name"``, JSON in and out) inside a namespace
    whose loopback runs at ``rate``; returns its result."""
    check_rate(rate)
    _check_tools()
    with tempfile.TemporaryDirectory(prefix="gradsift-shaped-") as tmp:
        out = Path(tmp) / "result.json"
        inner = [
            sys.executable,
            "-m",
            "gradsift.lab.shaping",
            rate,
            function,
            json.dumps(kwargs),
            str(out),
        ]
        script = (
            "ip link set lo up && "
            f"tc qdisc replace dev lo root tbf rate {rate} burst 512kb latency 100ms && "
            'exec "$@"'
        )
        proc = subprocess.run(
            ["unshare", "--net", "--", "sh", "-c", script, "sh", *inner],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            raise ValueError(
                f"shaped run at {rate} failed: {lines[-1] if lines else proc.returncode}"
            )
        return read_json(out)


def loopback_bytes() -> int:
    """Bytes sent over ``lo`` so far, in this network namespace (``/proc/net/dev``)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])  # transmit bytes
    raise RuntimeError("no loopback device in /proc/net/dev")


def send_bytes(nbytes: int) -> dict:
    """Send ``nbytes`` to ourselves over 127.0.0.1 (TCP); the seconds it took and the
    loopback's byte counter before and after: a probe that the shaping holds."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    received = []

    def drain():
        conn, _ = server.accept()
        with conn:
            while sum(received) < nbytes:
                received.append(len(conn.recv(1 << 16)))

    thread = threading.Thread(target=drain)
    thread.start()
    before, start = loopback_bytes(), time.perf_counter()
    with socket.create_connection(server.getsockname()) as client:
        client.sendall(bytes(nbytes))
        thread.join()
    seconds = time.perf_counter() - start
    server.close()
    return {"seconds": seconds, "lo_bytes": loopback_bytes() - before, "rate": os.environ.get(ENV)}


def _main(argv: list[str]) -> None:
    rate, function, kwargs, out = argv
    os.environ[ENV] = rate
    module, name = function.split(":")
    result = getattr(importlib.import_module(module), name)(**json.loads(kwargs))
    atomic_write_json(out, result)


if __name__ == "__main__":
    _main(sys.argv[1:])
