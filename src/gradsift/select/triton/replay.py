"""Launch sequences replayed as CUDA graphs: a selection of fixed shape is a dozen
small launches whose Python cost, not the GPU's work, sets its time at ~10M
elements. The first run of a sequence launches it; the second captures it
(``torch.cuda.CUDAGraph``) and every later one replays it in one launch.

The kernels read their inputs at the addresses captured, so a replay is keyed by
every pointer and size the sequence uses; another key captures afresh. Nothing is
captured inside a capture the caller is making (their graph takes the launches), on
CPU, or under Triton's interpreter.

Triton launches on the current device, not on its arguments' one, so every launch,
capture and replay runs under ``torch.cuda.device`` of the tensors (a model on
``cuda:1`` while ``cuda:0`` is current). A capture uses a stream of that device and
``capture_error_mode="thread_local"``: another thread's CUDA calls during it (a
DataLoader pinning memory) neither break it nor fail themselves.
"""

from __future__ import annotations

import torch

__all__ = ["Replay"]

_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}  # device index -> capture stream


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _CAPTURE_STREAMS[index]


class Replay:
    """One captured launch sequence and the key it was captured for."""

    def __init__(self) -> None:
        self.key = None
        self.graph = None
        self.runs = 0

    def __call__(self, key, device: torch.device, launch) -> None:
        """``launch()`` (which must allocate nothing and sync nothing), run or replayed."""
        if device.type != "cuda":
            launch()
            return
        with torch.cuda.device(device):
            if torch.cuda.is_current_stream_capturing():
                launch()
                return
            if key != self.key:
                self.key, self.graph, self.runs = key, None, 0
            if self.graph is None and self.runs >= 1:
                graph = torch.cuda.CUDAGraph()
                stream = _capture_stream(device)
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    launch()
                self.graph = graph
            self.runs += 1
            if self.graph is not None:
                self.graph.replay()
            else:
                launch()
