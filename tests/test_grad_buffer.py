"""The flat gradient buffer: views, foreign gradients, missing gradients, state."""

import gc
import weakref

import torch
from torch import nn

from gradsift.optim.flat_buffer import build_buckets


def params(dtype=torch.float32, grads=True):
    """Three parameters, with zero gradients (which ``build_buckets`` makes views of
    its buffer) unless ``grads=False``."""
    gen = torch.Generator().manual_seed(0)
    ps = [nn.Parameter(torch.randn(s, generator=gen, dtype=dtype)) for s in [(3, 4), (5,), (2, 2)]]
    for p in ps if grads else []:
        p.grad = torch.zeros_like(p)
    return ps


def test_existing_grads_become_views_and_backward_fills_the_buffer():
    ps = params(grads=False)
    ps[0].grad = torch.zeros(3, 4)
    ps[1].grad = torch.full((5,), 2.0)  # an existing gradient is kept
    [bucket] = build_buckets(ps, state=("residual",))
    assert bucket.grad.numel() == 21 and bucket.offsets == [0, 12, 17]
    assert torch.equal(bucket.grad[12:17], torch.full((5,), 2.0))
    assert bucket.owns_grad(0) and bucket.owns_grad(1)
    assert ps[2].grad is None  # a missing gradient stays None, as in torch
    (ps[0].sum() + 3 * ps[2].sum()).backward()
    assert torch.equal(bucket.grad[:12], torch.ones(12))  # accumulated in place
    assert not bucket.owns_grad(2) and torch.equal(ps[2].grad, torch.full((2, 2), 3.0))
    bucket.attach_grads_()  # backward's own tensor is copied in, the view given
    assert bucket.owns_grad(2) and torch.equal(bucket.grad[17:], torch.full((4,), 3.0))
    assert set(bucket.state) == {"residual"} and not bucket.state["residual"].any()
    assert bucket.view(bucket.state["residual"], 2).shape == (2, 2)


def test_attach_copies_foreign_grads_and_zeroes_missing_ones():
    ps = params()
    [bucket] = build_buckets(ps)
    foreign = torch.arange(5.0)
    ps[1].grad = foreign  # assigned: no longer the view
    ps[2].grad = None
    bucket.grad[17:] = 9.0  # stale values under the missing gradient
    assert not bucket.owns_grad(1)
    bucket.attach_grads_()
    assert bucket.owns_grad(1) and torch.equal(bucket.grad[12:17], foreign)
    assert ps[2].grad is None and not bucket.grad[17:].any()


def test_buckets_group_by_dtype_and_notice_a_changed_dtype():
    a, b = params(torch.float32), params(torch.float64)
    buckets = build_buckets(a + b)
    assert [x.grad.dtype for x in buckets] == [torch.float32, torch.float64]
    assert all(x.matches() for x in buckets)
    a[0].data = a[0].data.double()
    assert not buckets[0].matches() and buckets[1].matches()


def test_the_buffer_lives_only_as_long_as_its_views():
    ps = params()
    [bucket] = build_buckets(ps)
    ref = weakref.ref(bucket.grad)
    for p in ps:
        p.grad = None
    gc.collect()
    assert ref() is None and bucket.grad is None  # freed with its last view
    assert bucket.present(set()) == [False, False, False]
    ps[0].grad = torch.ones(3, 4)
    bucket.attach_grads_()  # allocated again, the missing slices zeroed
    assert bucket.owns_grad(0) and torch.equal(bucket.grad[:12], torch.ones(12))
    assert not bucket.grad[12:].any() and ps[1].grad is None
    bucket.let_go_()
    assert bucket.grad is not None  # ps[0]'s view keeps it
    kept = ps[0].grad
    ps[0].grad = None
    bucket.attach_grads_()  # someone kept the old buffer: a new one, theirs unchanged
    assert bucket.grad is not kept._base and torch.equal(kept, torch.ones(3, 4))


def test_a_tensor_at_a_views_address_is_not_taken_for_the_view():
    # a freed buffer's memory goes to the next allocation, e.g. backward's new
    # gradient: same address, shape and strides, but not a view of the buffer
    ps = params()
    [bucket] = build_buckets(ps)
    assert bucket.owns_grad(0)  # the views' addresses are cached
    alias = torch.empty(0).set_(bucket.grad.untyped_storage(), 0, (3, 4), (4, 1))
    ps[0].grad = alias
    assert alias.data_ptr() == bucket.grad.data_ptr() and not bucket.owns_grad(0)


def test_views_backward_did_not_reach_are_read_in_one_host_sync(monkeypatch):
    # a model with unused layers, the buffer kept between steps (zero_grad keeps it):
    # whether an untouched view holds a gradient is read from the device once for all
    # of them (a host sync each had cost a GPU one per parameter, every step)
    import traceback

    from gradsift import TopK

    model = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), density=0.1)
    reads = []

    def counted(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args):
            if any(f.name == "present" for f in traceback.extract_stack()):
                reads.append(name)
            return real(self, *args)

        return read

    for name in ("__bool__", "tolist", "item"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    x = torch.randn(3, 8)
    for step in range(3):
        opt.zero_grad()
        model[0](x).sum().backward()  # layers 1-3 unused: 6 untouched views
        reads.clear()
        opt.step()
        assert len(reads) <= 1, (step, reads)
        assert all(p.grad is None or not p.grad.any() for p in model[1:].parameters())


def test_no_gradient_yet_allocates_no_buffer():
    # a fresh model under TopK: only the state is allocated (a gradient-sized buffer
    # zeroed and dropped at once had doubled the gradient memory needed to build it)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                made.append(out.numel())
            return out

    made = []
    ps = params(grads=False)
    with Sizes():
        [bucket] = build_buckets(ps, state=("residual",))
    assert made == [21] and bucket.grad is None and bucket.numel == 21
    (ps[0].sum() + ps[1].sum()).backward()
    bucket.attach_grads_()  # the first step allocates it
    assert bucket.owns_grad(0) and torch.equal(bucket.grad[:17], torch.ones(17))
    assert ps[2].grad is None and not bucket.grad[17:].any()
