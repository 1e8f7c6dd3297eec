"""FORCE: de Jorge, Sanyal, Behl, Torr, Rogez & Dokania, "Progressive Skeletonization:
Trimming more fat from a network at initialization", ICLR 2021, arXiv:2006.09081.

Foresight connection sensitivity: maximise ``Σ |θ ⊙ ∂L(θ ⊙ m)/∂w|`` over masks ``m``
of the target density, approximately, in ``steps`` rounds of exponentially decaying
density. Each round scores ``|θ ⊙ g|`` with ``g`` the loss gradient of the current
sparse network ``θ ⊙ m`` and ranks all weights again, so pruned weights can come back
(``_progressive`` has the loop).

The criterion needs the target: ``prune_at_init`` passes ``sparsity`` (registry:
``takes_sparsity``); ``score(model, "force", data, sparsity=s)`` returns the final
round's saliency, whose top ``1 - s`` fraction is FORCE's mask.
"""

from __future__ import annotations

from gradsift.pruning.methods._progressive import progressive_criterion
from gradsift.pruning.registry import register_method

force = progressive_criterion(
    "force",
    revive=True,
    doc="""The final round's ``|θ ⊙ g|`` after ``steps - 1`` rounds towards ``sparsity``
    (``decay``: ``"exponential"`` or ``"linear"``); ``g`` summed over ``num_batches``
    batches read afresh each round (a shuffled loader gives new ones, as the authors'
    code does).""",
)

register_method("force", force)
