"""Iterative SNIP: de Jorge, Sanyal, Behl, Torr, Rogez & Dokania, "Progressive
Skeletonization: Trimming more fat from a network at initialization", ICLR 2021,
arXiv:2006.09081.

SNIP's ``|w ⊙ g|`` recomputed on the pruned network in ``steps`` rounds of
exponentially decaying density; pruning is permanent (``_progressive`` has the loop).
One step is SNIP.

The criterion needs the target: ``prune_at_init`` passes ``sparsity`` (registry:
``takes_sparsity``). ``score(model, "iter_snip", data, sparsity=s)`` returns the last
round's saliency for the survivors and ``r - steps`` for a weight pruned in round ``r``,
so that its top ``1 - s`` fraction is the method's mask.
"""

from __future__ import annotations

from gradsift.pruning.methods._progressive import progressive_criterion
from gradsift.pruning.registry import register_method

iter_snip = progressive_criterion(
    "iter_snip",
    revive=False,
    doc="""``|w ⊙ g|`` on the network pruned in ``steps - 1`` rounds towards ``sparsity``
    (``decay``: ``"exponential"`` or ``"linear"``); ``g`` summed over ``num_batches``
    batches read afresh each round.""",
)

register_method("iter_snip", iter_snip)
