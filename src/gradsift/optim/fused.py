"""Whether ``TopK.step`` runs as fused GPU kernels, decided here only, and the call
into them (``gradsift.select.triton.fused_step.FusedStep``, a function of tensors).

The fused step applies to one flat bucket holding every gradient of the step, with
``scope="global"``, a kernel dtype (float16, bfloat16, float32) and fewer kept
coordinates than the parameters with a gradient hold (those without one are held out
of the selection: ``GradSet.holding_out``); ``backend="auto"`` also needs CUDA
gradients and triton. Anything else runs the torch path; a case the fused step does not cover is
logged once at INFO and counted in ``TopK.fallback_steps``.
"""

from __future__ import annotations

import logging

from gradsift.checks import NonFiniteGradError, check_finite_grads
from gradsift.select.dispatch import DTYPES, require_triton, triton_available

__all__ = ["fused_step_"]

log = logging.getLogger(__name__)


def _why_not(opt) -> str | None:
    """None where the fused step applies to ``opt``'s step, else the reason."""
    grads = opt._grads
    if grads.stale() or len(grads.buckets) != 1:
        return "the gradients span several buckets (dtypes or devices)"
    if opt.scope != "global":
        return 'scope="layer"'
    b = grads.buckets[0]
    if grads.outside(opt._params()):
        return "a gradient lies outside the flat buffer"
    if b.dtype not in DTYPES:
        return f"dtype {b.dtype}"
    grads.attach()
    n = grads.present_count(0)
    if n == 0:
        return "no parameter got a gradient this step"
    if opt.budget.resolve(n) >= n:
        return "every coordinate is kept"
    return None


def fused_step_(opt) -> bool:
    """``opt.step()`` as fused kernels; False (nothing done) where the torch path must
    run: ``backend="torch"``, ``"auto"`` without CUDA gradients or triton, or a case
    the fused step does not cover."""
    opt.found_nonfinite = None
    buckets = opt._grads.buckets
    if opt.backend == "torch" or not buckets:
        return False
    if opt.backend == "auto" and not (buckets[0].device.type == "cuda" and triton_available()):
        return False
    if opt.backend == "triton":  # checked at construction; the model may have moved since
        require_triton(buckets[0].device)
    why = _why_not(opt)
    if why is not None:
        opt.fallback_steps += 1
        if why not in opt._fallbacks_logged:
            opt._fallbacks_logged.add(why)
            log.info("TopK: the fused GPU step does not apply (%s); the torch path runs", why)
        return False
    from gradsift.select.triton.fused_step import FusedStep

    b, grads = buckets[0], opt._grads
    if opt._fused is None or opt._fused[0] is not b:
        opt._fused = (b, FusedStep())
    fused, lrs = opt._fused[1], opt._sparse_sgd_lrs()
    with grads.holding_out(0):
        fused.step_(
            b.grad,
            opt.budget.resolve(grads.present_count(0)),
            residual=b.state.get("residual"),
            velocity=b.state.get("momentum"),
            momentum=opt.momentum_correction or 0.0,
            params=b.params,
            offsets=b.offsets,
            lrs=lrs,
        )
    opt.found_nonfinite = fused.found_nonfinite
    if lrs is None:
        if bool(opt.found_nonfinite):  # the one host sync of this case
            check_finite_grads(b.params, [b.grad], opt._name)
            raise NonFiniteGradError("the error-feedback sum holds NaN; nothing was modified")
        with grads.absent_as_none():
            opt.optimizer.step()
    return True
