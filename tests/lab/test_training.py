"""Training loop: top-k with error feedback converges on the embedded digits."""

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from gradsift import NonFiniteGradError, TopK
from gradsift.lab.data import digits, loader
from gradsift.lab.models import build_model
from gradsift.lab.runs import run_one
from gradsift.lab.specs import RunSpec
from gradsift.lab.training import TrainConfig, evaluate, fit, make_optimizer, train


def _acc(density, ef):
    spec = RunSpec(
        model="mlp", seed=0, train=TrainConfig(epochs=10, density=density, error_feedback=ef)
    )
    return run_one(spec)["test_accuracy"]


def test_topk_with_error_feedback_matches_dense_on_digits():
    dense = _acc(None, True)
    sparse_ef = _acc(0.01, True)
    sparse_no_ef = _acc(0.01, False)
    assert dense > 0.9
    assert sparse_ef >= dense - 0.02, (sparse_ef, dense)
    assert sparse_ef > sparse_no_ef, (sparse_ef, sparse_no_ef)


def test_make_optimizer_wraps_only_when_sparse():
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    assert isinstance(make_optimizer(model, TrainConfig(density=0.1)), TopK)
    assert isinstance(make_optimizer(model, TrainConfig()), torch.optim.SGD)


def test_evaluate_restores_mode_and_bad_schedule():
    ds = digits()
    model = build_model("lenet5", input_shape=ds.input_shape, num_classes=10).train()
    metrics = evaluate(model, ds.test)
    assert model.training and 0.0 <= metrics["accuracy"] <= 1.0
    with pytest.raises(ValueError, match="schedule"):
        train(model, ds.train, ds.test, TrainConfig(epochs=1, schedule="step"))


@pytest.mark.parametrize("density", [None, 0.01])
def test_a_run_that_diverges_says_so_in_its_record_and_its_log(caplog, density):
    """SGD at lr 1e4 sends the loss to inf/NaN; the record must not pass the broken
    network's accuracy off as a result (its accuracy is that of a constant output).
    A top-k run is recorded so too, where TopK refuses the non-finite gradient."""
    spec = RunSpec(model="mlp", seed=0, train=TrainConfig(epochs=2, lr=1e4, density=density))
    with caplog.at_level("WARNING", logger="gradsift"):
        record = run_one(spec)
    assert record["diverged"] is True
    assert any("diverged" in m for m in caplog.messages), caplog.messages
    healthy = run_one(RunSpec(model="mlp", seed=0, train=TrainConfig(epochs=1)))
    assert healthy["diverged"] is False


class _Skipping(torch.optim.SGD):
    """SGD whose second step is refused as TopK refuses a non-finite gradient: by
    raising, or (``flag``) as the fused GPU step does, skipping with a device bool."""

    def __init__(self, params, flag: bool):
        super().__init__(params, lr=0.1)
        self.flag, self.steps, self.taken = flag, 0, 0

    def step(self, closure=None):
        self.steps += 1
        bad = self.steps == 2
        if self.flag:
            self.found_nonfinite = torch.tensor(bad)
        elif bad:
            raise NonFiniteGradError("gradient of w has 1 non-finite entries")
        if not bad:
            self.taken += 1
            super().step()


@pytest.mark.parametrize("flag", [False, True])
def test_a_skipped_step_makes_its_epoch_loss_nan_and_training_goes_on(flag):
    """The loss stays finite but the step was refused: that epoch diverged, the next
    ones are measured as usual, and every other step is taken."""
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    data = loader(digits().train, batch_size=500, shuffle=False)  # 3 steps an epoch
    opt, means = _Skipping(model.parameters(), flag), []
    fit(model, opt, data, epochs=2, on_epoch=lambda e, m: means.append(m))
    assert math.isnan(means[0]) and math.isfinite(means[1]), means
    assert (opt.steps, opt.taken) == (6, 5)


def test_fit_reads_the_loss_once_an_epoch_and_averages_it_as_python_floats(monkeypatch):
    """The mean training loss is summed on the loss's device (one host sync an epoch,
    not one a step), and equals the per-step Python-float sum bit for bit."""
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    data = loader(digits().train, batch_size=100, shuffle=True)  # 1,348: the last has 48
    losses, means, items = [], [], []

    def loss_fn(out, y):
        loss = F.cross_entropy(out, y)
        losses.append((loss.detach().clone(), y.numel()))
        return loss

    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: items.append(t.dtype) or item(t))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, opt, data, epochs=2, loss_fn=loss_fn, on_epoch=lambda e, m: means.append(m))
    monkeypatch.undo()
    # (the DataLoader reads an int64 seed once an epoch)
    assert [d for d in items if d.is_floating_point] == [torch.float64] * 2, items
    steps = len(data)
    for epoch, mean in enumerate(means):
        total = 0.0
        for loss, n in losses[epoch * steps : (epoch + 1) * steps]:
            total += loss.item() * n
        assert mean == total / 1348


def test_evaluate_reads_its_sums_once_and_equals_python_float_sums(monkeypatch):
    torch.manual_seed(0)
    ds = digits()
    model = build_model("mlp", input_shape=ds.input_shape, num_classes=10)
    loss, correct = 0.0, 0
    for x, y in loader(ds.test, batch_size=100):  # 449: five batches
        with torch.no_grad():
            out = model(x)
        loss += float(F.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    reads = []
    for name in ("__float__", "__int__"):  # (the DataLoader .item()s a seed of its own)
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda t, name=name, real=real: reads.append(name) or real(t)
        )
    metrics = evaluate(model, ds.test, batch_size=100)
    monkeypatch.undo()
    assert sorted(reads) == ["__float__", "__int__"], reads
    assert metrics == {"accuracy": correct / 449, "loss": loss / 449}


def test_the_epoch_loss_is_the_mean_over_every_ranks_samples():
    """Under DDP or FSDP each rank trains on its shard; the history's training loss is
    the mean over all of them (it was rank 0's shard alone)."""
    import ddp_workers
    from worlds import rank_results, run_world

    results = rank_results(run_world(ddp_workers.epoch_losses, 2), 2)
    mean = sum(own for own, _ in results) / 2  # equal shards
    assert results[0][0] != pytest.approx(results[1][0], rel=1e-3)  # the shards differ
    for _, reported in results:
        assert reported == pytest.approx(mean, rel=1e-6)
