"""``Replay``'s CUDA logic with torch.cuda's graph, stream and device calls faked: run
on CPU, it checks what runs when (launch, capture, replay), on which device, and with
which capture arguments (bound against the real ``torch.cuda.graph`` signature).
``tests/gpu/test_select_cuda.py`` captures and replays for real on a GPU."""

import contextlib
import inspect

import pytest
import torch

from gradsift.select.triton import replay as replay_module
from gradsift.select.triton.replay import Replay


class FakeCuda:
    """The current device, the capture in progress, and what happened, in order."""

    def __init__(self):
        self.current, self.capturing, self.events, self.streams = 0, False, [], []

    @contextlib.contextmanager
    def device(self, device):
        previous, self.current = self.current, torch.device(device).index
        try:
            yield
        finally:
            self.current = previous

    def stream(self, device=None, priority=0):
        self.streams.append(device)
        return ("stream", device)

    def graph_class(self):
        fake = self

        class Graph:
            def replay(self):
                fake.events.append(("replay", fake.current))

        return Graph

    def graph(self, cuda_graph, **kwargs):
        inspect.signature(torch.cuda.graph.__init__).bind(None, cuda_graph, **kwargs)
        fake = self

        @contextlib.contextmanager
        def capture():
            fake.events.append(("capture", fake.current, kwargs))
            fake.capturing = True
            try:
                yield
            finally:
                fake.capturing = False

        return capture()


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "device", fake.device)
    monkeypatch.setattr(torch.cuda, "Stream", fake.stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", fake.graph_class())
    monkeypatch.setattr(torch.cuda, "graph", fake.graph)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: fake.capturing)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current)
    monkeypatch.setattr(replay_module, "_CAPTURE_STREAMS", {}, raising=False)
    return fake


def test_launches_then_captures_then_replays_on_the_tensors_device(cuda):
    dev = torch.device("cuda", 1)  # not the current device (0)
    replay = Replay()

    def launch():
        cuda.events.append(("launch", cuda.current, cuda.capturing))

    for _ in range(3):
        replay("key", dev, launch)
    capture_kwargs = {"stream": ("stream", 1), "capture_error_mode": "thread_local"}
    assert cuda.events == [
        ("launch", 1, False),  # first run: compiles, allocates
        ("capture", 1, capture_kwargs),
        ("launch", 1, True),
        ("replay", 1),
        ("replay", 1),
    ]
    assert cuda.current == 0 and cuda.streams == [1]

    cuda.events.clear()
    replay("other key", dev, launch)  # other addresses: launched, captured afresh later
    replay("other key", dev, launch)
    assert [e[0] for e in cuda.events] == ["launch", "capture", "launch", "replay"]
    assert cuda.streams == [1]  # one capture stream per device


def test_inside_a_callers_capture_only_launches(cuda):
    cuda.capturing = True
    replay = Replay()
    for _ in range(3):
        replay("key", torch.device("cuda", 0), lambda: cuda.events.append(("launch", cuda.current)))
    assert cuda.events == [("launch", 0)] * 3 and replay.graph is None


def test_on_cpu_only_launches(cuda):
    replay = Replay()
    for _ in range(3):
        replay("key", torch.device("cpu"), lambda: cuda.events.append("launch"))
    assert cuda.events == ["launch"] * 3 and replay.graph is None
