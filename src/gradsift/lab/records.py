"""The record of one run (``RunRecord``), the one record type of ``results.json`` and
``result.json``: how a run's spec and outcome make one, and how older files read."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gradsift.lab.atomic import read_json
from gradsift.lab.specs import RunSpec

__all__ = ["RunRecord", "diverged", "load_results", "upgraded"]


@dataclass
class RunRecord:
    """The result of one run, the one record type of ``results.json`` / ``result.json``."""

    key: str
    model: str
    dataset: str
    method: str  # "unpruned" when not pruned
    sparsity: float
    iterations: int
    shuffle: bool
    seed: int
    world_size: int
    grad_density: float
    error_feedback: bool
    epochs: int
    kept: int
    total: int
    collapsed: list
    test_accuracy: float
    test_loss: float
    history: list
    prune_seconds: float
    seconds: float
    compression_ratio: float = 1.0
    allocation: str = "global"  # "budget" in records written before the rename
    sanity: str | None = None
    diverged: bool = False  # a non-finite loss: test_accuracy is a broken network's
    sharded: bool = False  # trained sharded with FSDP2 (TopK across the shards)

    @classmethod
    def of(cls, spec: RunSpec, **outcome) -> RunRecord:
        """The record of ``spec``'s run: what the spec says (its key, model, method or
        ``"unpruned"``, the sanity variant, the training's density, 1.0 when dense, ...)
        and the ``outcome`` fields (``world_size``, ``kept``, ``test_accuracy``, ...;
        ``grad_density`` too where the training kept ``k`` coordinates, as ``k`` over
        the trainable ones)."""
        t = spec.train
        density = outcome.pop("grad_density", None)
        if density is None:
            density = t.density if t.density is not None else 1.0
        return cls(
            key=spec.key(),
            model=spec.model,
            dataset=spec.dataset,
            method=spec.method or "unpruned",
            sparsity=spec.sparsity,
            iterations=spec.iterations,
            shuffle=spec.variant == "shuffle-layer",
            seed=spec.seed,
            grad_density=density,
            error_feedback=t.error_feedback,
            epochs=t.epochs,
            allocation=spec.allocation,
            sanity=spec.variant,
            **outcome,
        )

    def to_dict(self) -> dict:
        return asdict(self)


def diverged(record: dict) -> bool:
    """Whether a run's loss went non-finite (SGD diverged): its own flag, or for
    records older than the flag, a non-finite test loss or epoch training loss."""
    losses = [record.get("test_loss")] + [h.get("train_loss") for h in record.get("history", [])]
    return bool(record.get("diverged")) or any(
        x is not None and not math.isfinite(x) for x in losses
    )


def upgraded(record: dict) -> dict:
    """``record`` in today's field names: a record written before the layer allocation
    was called ``allocation`` holds it as ``"budget"``, and one written before either
    existed ran under ``"global"`` (its ``key`` is left as written: ``RunSpec.key``
    still spells it so)."""
    allocation = record.pop("budget", "global")
    record.setdefault("allocation", allocation)
    return record


def load_results(path) -> list[dict]:
    """The runs of a results file (none when it does not exist), upgraded to today's
    field names (``upgraded``)."""
    data = read_json(path, default={"runs": []})
    if not isinstance(data, dict) or not isinstance(data.get("runs", []), list):
        raise ValueError(
            f"{path} must hold a JSON object with a list of 'runs', got {type(data).__name__}"
        )
    runs = data.get("runs", [])
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or not isinstance(r.get("key"), str):
            raise ValueError(f"{path}: runs[{i}] is not a run record (an object with a 'key')")
    return [upgraded(r) for r in runs]
