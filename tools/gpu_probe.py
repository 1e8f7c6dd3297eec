"""GPU probe: compiled Triton vs its interpreter on the constructs the selection uses
(order keys, masked histograms, unsigned reductions and compares). Prints one line per
check; run on a CUDA machine: PYTHONPATH=src python3 tools/gpu_probe.py"""
import sys
import torch
import triton
import triton.language as tl

from gradsift.select.triton.keys import order_key

dev = "cuda" if torch.cuda.is_available() else "cpu"
print("triton", triton.__version__, "torch", torch.__version__, dev, flush=True)


def ref_key(x, absolute):
    if x.element_size() == 2:
        b = x.view(torch.int16).to(torch.int32)
        if absolute:
            s = b & 0x7FFF
        else:
            b = torch.where((b & 0x7FFF) == 0, 0, b)
            s = b ^ ((b >> 15) & 0x7FFF)
        return (s + 32768).to(torch.int64)
    b = x.view(torch.int32).to(torch.int64)
    if absolute:
        s = b & 0x7FFFFFFF
    else:
        b = torch.where((b & 0x7FFFFFFF) == 0, 0, b)
        s = torch.where(b < 0, b ^ 0x7FFFFFFF, b)
    return (s + 2**31) & 0xFFFFFFFF


@triton.jit
def key_kernel(x_ptr, out_ptr, n, ABSOLUTE: tl.constexpr, BITS: tl.constexpr):
    i = tl.arange(0, 1024)
    m = i < n
    v = tl.load(x_ptr + i, mask=m, other=0.0)
    k = order_key(v, ABSOLUTE, BITS)
    tl.store(out_ptr + i, k.to(tl.int64), mask=m)  # uint32 -> int64: zero-extend?
    tl.store(out_ptr + 1024 + i, k.to(tl.int32, bitcast=True).to(tl.int64), mask=m)


@triton.jit
def hist_kernel(d_ptr, m_ptr, out_ptr):
    i = tl.arange(0, 4096)
    d = tl.load(d_ptr + i)
    m = tl.load(m_ptr + i) != 0
    tl.store(out_ptr + tl.arange(0, 256), tl.histogram(d, 256, mask=m))
    tl.store(out_ptr + 256 + tl.arange(0, 256), tl.histogram(d, 256))


@triton.jit
def umax_kernel(x_ptr, out_ptr):
    i = tl.arange(0, 1024)
    u = tl.load(x_ptr + i).to(tl.uint32, bitcast=True)
    tl.store(out_ptr, tl.max(u, 0).to(tl.int32, bitcast=True))
    v = tl.max(u, 0)
    tl.store(out_ptr + 1, tl.sum((u > v - 1).to(tl.int32), 0))
    w = tl.full([], 0, tl.uint32) | (tl.full([], 200, tl.int32).to(tl.uint32) << 24)
    tl.store(out_ptr + 2, tl.sum((u > w).to(tl.int32), 0))


fails = 0
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for absolute in (True, False):
        x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(dtype)
        x[:4] = torch.tensor([0.0, -0.0, 1.0, -1.0]).to(dtype)
        out = torch.zeros(2048, dtype=torch.int64, device=dev)
        key_kernel[(1,)](x.to(dev), out, 1000, ABSOLUTE=absolute, BITS=8 * x.element_size())
        ref = ref_key(x, absolute)
        got = out[:1000].cpu()
        ok = torch.equal(got, ref)
        fails += not ok
        bad = (got != ref).nonzero().flatten()[:3].tolist()
        print(f"order_key {dtype} abs={absolute}: {'ok' if ok else 'DIFF'} "
              f"first bad {[(i, got[i].item(), ref[i].item(), x[i].item()) for i in bad]}", flush=True)

g = torch.Generator().manual_seed(1)
d = torch.randint(0, 256, (4096,), generator=g, dtype=torch.int32)
m = (torch.rand(4096, generator=g) < 0.3).to(torch.int32)
out = torch.zeros(512, dtype=torch.int32, device=dev)
hist_kernel[(1,)](d.to(dev), m.to(dev), out)
ref_m = torch.bincount(d[m.bool()].long(), minlength=256).int()
ref_all = torch.bincount(d.long(), minlength=256).int()
ok1, ok2 = torch.equal(out[:256].cpu(), ref_m), torch.equal(out[256:].cpu(), ref_all)
fails += not (ok1 and ok2)
print(f"histogram masked: {'ok' if ok1 else 'DIFF'}  unmasked: {'ok' if ok2 else 'DIFF'} "
      f"masked sum {out[:256].sum().item()} vs {ref_m.sum().item()}", flush=True)

u = torch.randint(-2**31, 2**31 - 1, (1024,), generator=g, dtype=torch.int64).to(torch.int32)
out = torch.zeros(3, dtype=torch.int32, device=dev)
umax_kernel[(1,)](u.to(dev), out)
uu = u.to(torch.int64) & 0xFFFFFFFF
refmax = int(uu.max())
got = int(out[0]) & 0xFFFFFFFF
print(f"uint32 max: {'ok' if got == refmax else 'DIFF'} got {got:#x} ref {refmax:#x}; "
      f"count>max-1 {int(out[1])} (ref {(uu > refmax - 1).sum().item()}); "
      f"count>200<<24 {int(out[2])} (ref {(uu > (200 << 24)).sum().item()})", flush=True)
fails += got != refmax
print("probe fails:", fails)

# the root cause: a masked histogram of a tile reshaped from 2-D (the 0.1.0 kernels)
@triton.jit
def reshaped_hist_kernel(d_ptr, n, out_ptr, MASKED: tl.constexpr):
    idx = tl.arange(0, 128)[:, None] * 32 + tl.arange(0, 32)[None, :]
    valid2 = idx < n
    d2 = tl.load(d_ptr + idx, mask=valid2, other=0)
    d = tl.reshape(d2, (4096,))
    valid = tl.reshape(valid2, (4096,))
    if MASKED:
        h = tl.histogram(d, 256, mask=valid)
    else:
        h = tl.histogram(tl.where(valid, d, 0), 256)
        h = h - tl.where(tl.arange(0, 256) == 0, tl.sum(tl.where(valid, 0, 1), 0), 0)
    tl.store(out_ptr + tl.arange(0, 256), h)


for n in (16, 1000, 4096):
    d = torch.randint(1, 256, (4096,), generator=g, dtype=torch.int32)
    ref = torch.bincount(d[:n].long(), minlength=256).int()
    for masked in (True, False):
        out = torch.zeros(256, dtype=torch.int32, device=dev)
        reshaped_hist_kernel[(1,)](d.to(dev), n, out, MASKED=masked)
        same = torch.equal(out.cpu(), ref)
        print(f"reshaped tile histogram n={n} {'mask=' if masked else 'bin-0 fix'}: "
              f"{'ok' if same else 'DIFF'} (bin 0: {int(out[0])}, ref {int(ref[0])})", flush=True)

