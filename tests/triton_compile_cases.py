"""Compile every Triton kernel ahead of time for sm_90 (H100/H200), no GPU needed: the
check that the kernels build for a real device, not only run under the interpreter.

Run as a script by ``test_triton_compile.py``, in a process without
``TRITON_INTERPRET`` (the interpreter replaces the kernels by Python functions that
cannot be compiled). Prints one line per kernel variant compiled.
"""

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gradsift.select.triton.fused_step import scatter_kernel, write_kernel
from gradsift.select.triton.keys import block_keys_kernel
from gradsift.select.triton.stages import stage_kernel

TARGET = GPUTarget("cuda", 90, 32)

STAGE_SIG = dict(
    x_ptr="*fp32", r_ptr="*fp32", u_ptr="*fp32", m="fp32", keys_ptr="*i32",
    cand_ptr="*i32", lidx_ptr="*i64", lval_ptr="*fp32", state_ptr="*i64", hist_ptr="*i64",
    counts_ptr="*i64",
    out_ptr="*i64", val_ptr="*fp32", n="i32", nblocks="i32", cap="i32", ecap="i32",
    k="i32", nprog="i32", phase="i32", p="i32", absolute="i32", all_="i32",
)  # fmt: skip


def compile_sm90(fn, signature: dict, constexprs: dict) -> tuple[int, str]:
    """Bytes of the cubin ``fn`` compiles to with these argument types and constants,
    and ``i64`` if it multiplies in 64 bits (a program's first position must, where
    positions pass 2**31), else ``i32``."""
    sig = dict(signature) | {name: "constexpr" for name in constexprs}
    src = ASTSource(fn, sig, constexprs=constexprs)
    kernel = triton.compile(src, target=TARGET, options={"enable_fp_fusion": False})
    wide = re.search(r"arith\.muli [^:]+: i64", kernel.asm["ttir"])
    return len(kernel.asm["cubin"]), "i64" if wide else "i32"


def stage_cases():
    # (STAGE, OUT, BLOCK, WIDE): each stage and output, both block sizes, 64-bit indices
    cases = [(0, 1, 32, False), (1, 1, 32, False), (2, 1, 32, False), (2, 2, 32, False),
             (1, 1, 8, False), (0, 1, 8, True), (1, 1, 8, True), (2, 1, 32, True)]  # fmt: skip
    for stage, out, block, wide in cases:
        sig = STAGE_SIG | ({"out_ptr": "*u8"} if out == 2 else {})
        if wide:  # 64-bit sizes, and the candidate blocks' list (past 2**31 blocks)
            sig |= {"n": "i64", "nblocks": "i64", "cap": "i64", "ecap": "i64", "k": "i64"}
            sig |= {"cand_ptr": "*i64"}
        consts = dict(STAGE=stage, MODE=2, BITS=32, BLOCK=block, OUT=out, WIDE=wide)
        yield f"stage {stage}-{out}-{block}{'-wide' * wide}", stage_kernel, sig, consts


def other_cases():
    keys = dict(x_ptr="*bf16", r_ptr="*bf16", u_ptr="*bf16", m="fp32", keys_ptr="*i32")
    keys |= dict(state_ptr="*i64", n="i32", nblocks="i32", absolute="i32")
    consts = dict(MODE=2, BITS=16, BLOCK=32, WIDE=False)
    yield "block keys bf16", block_keys_kernel, keys, consts
    write = dict(x_ptr="*fp16", r_ptr="*fp16", u_ptr="*fp16", m="fp32", state_ptr="*i64", n="i32")
    yield "write fp16", write_kernel, write, dict(MODE=2, WIDE=False)
    yield "write fp16-wide", write_kernel, write | {"n": "i64"}, dict(MODE=2, WIDE=True)
    scatter = dict(idx_ptr="*i64", val_ptr="*fp32", x_ptr="*fp32", r_ptr="*fp32", u_ptr="*fp32")
    scatter |= dict(state_ptr="*i64", k="i32", ptrs_ptr="*i64", offsets_ptr="*i64", lrs_ptr="*fp32")
    yield "scatter+sgd", scatter_kernel, scatter, dict(MODE=2, APPLY=True, SEARCH=6, WIDE=False)
    yield "scatter+sgd-wide", scatter_kernel, scatter, dict(MODE=2, APPLY=True, SEARCH=6, WIDE=True)


if __name__ == "__main__":
    for name, fn, sig, consts in [*stage_cases(), *other_cases()]:
        size, product = compile_sm90(fn, sig, consts)
        print(name, product, size, flush=True)
