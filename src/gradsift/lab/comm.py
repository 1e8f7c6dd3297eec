"""The gradient communications a data-parallel run can use, by name, for training
(``TrainConfig.comm``) and the DDP benchmark alike.

- ``allreduce``: DDP's own.
- ``fp16``: torch's ``fp16_compress_hook``.
- ``powersgd``: torch's PowerSGD (Vogels et al. 2019, arXiv:1905.13727), rank 4.
- ``topk``: gradsift's top-k hook, error feedback, float32 values.
- ``topk-dgc``: the Deep Gradient Compression recipe on top: momentum correction
  (the hook keeps the velocity and the inner SGD has none), DGC's four-epoch density
  warm-up, bfloat16 values in the compact wire format.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from gradsift.distributed import TopKHookState, dgc_warmup, topk_hook

__all__ = ["COMMS", "PowerSGDRunState", "make_hook"]

COMMS = ("allreduce", "fp16", "powersgd", "topk", "topk-dgc")


class PowerSGDRunState(powerSGD_hook.PowerSGDState):
    """torch's PowerSGD state with what a gradsift run asks of every hook state:
    ``compression_ratio`` and ``state_dict``/``load_state_dict`` for checkpoints.

    The ratio is torch's own count, numel before over numel after compression
    (both float32, so it is also the bytes ratio); like torch, it leaves out the
    ``start_powerSGD_iter`` plain-allreduce warm-up steps. The saved state is the
    iteration, the error feedback, the P/Q warm-start memories and the sketching
    RNG: enough to resume bit-for-bit, in tensors a ``weights_only`` load accepts.
    """

    _TENSOR_DICTS = ("error_dict", "p_memory_dict", "q_memory_dict")

    @property
    def compression_ratio(self) -> float:
        before, after = self.total_numel_before_compression, self.total_numel_after_compression
        return before / after if after else 1.0

    def state_dict(self) -> dict:
        out = {name: {k: v.clone() for k, v in getattr(self, name).items()}
               for name in self._TENSOR_DICTS}  # fmt: skip
        kind, keys, pos, has_gauss, gauss = self.rng.get_state()
        out["rng"] = [kind, torch.from_numpy(keys.copy()), pos, has_gauss, gauss]
        out["counters"] = [self.iter, self.total_numel_before_compression,
                           self.total_numel_after_compression]  # fmt: skip
        return out

    def load_state_dict(self, state: dict) -> None:
        for name in self._TENSOR_DICTS:
            setattr(self, name, {k: v.clone() for k, v in state[name].items()})
        kind, keys, pos, has_gauss, gauss = state["rng"]
        self.rng.set_state((kind, keys.numpy().copy(), pos, has_gauss, gauss))
        (self.iter, self.total_numel_before_compression,
         self.total_numel_after_compression) = state["counters"]  # fmt: skip


def make_hook(
    comm: str,
    *,
    density=None,
    k=None,
    error_feedback=True,
    momentum: float = 0.0,
    iterations_per_epoch: int = 1,
    encoding: str = "auto",
    value_dtype=None,
):
    """``(state, hook, inner_momentum)`` for ``comm``; hook None means allreduce."""
    if comm == "allreduce":
        return None, None, momentum
    if comm == "fp16":
        return None, default_hooks.fp16_compress_hook, momentum
    if comm == "powersgd":
        state = PowerSGDRunState(None, matrix_approximation_rank=4, start_powerSGD_iter=2)
        return state, powerSGD_hook.powerSGD_hook, momentum
    if comm == "topk":
        state = TopKHookState(
            density=density,
            k=k,
            error_feedback=error_feedback,
            encoding=encoding,
            value_dtype=value_dtype,
        )
        return state, topk_hook, momentum
    if comm == "topk-dgc":
        if density is None:
            raise ValueError("comm='topk-dgc' needs a density (its warm-up ramps down to it)")
        state = TopKHookState(
            density=density,
            value_dtype=torch.bfloat16,
            momentum_correction=momentum or None,
            warmup=dgc_warmup(density, iterations_per_epoch),
        )
        return state, topk_hook, 0.0
    raise ValueError(f"comm must be one of {list(COMMS)}, got {comm!r}")
