"""gradsift with Lightning: TopK from configure_optimizers, the DDP hook through
gradsift's callback on CPU gloo ranks."""

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

import ddp_workers  # noqa: E402
from distributed.test_hook import run_two  # noqa: E402
from gradsift.distributed import TopKHookState  # noqa: E402
from gradsift.integrations.lightning import TopKHookCallback  # noqa: E402


def test_the_callback_makes_the_hook_run_on_two_cpu_gloo_ranks():
    for rank, iters, ratio, world, scaled in run_two(ddp_workers.lightning_fit):
        assert world == 2 and iters == 4, (rank, iters)  # one hook step per batch
        assert ratio > 1, (rank, ratio)  # compressed steps ran
        # the residual is kept in the loss scale's units (and clip_norm read in them)
        assert scaled, "the hook was not given Lightning's GradScaler"


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = ddp_workers.small_model()

    def training_step(self, b, _):
        return torch.nn.functional.cross_entropy(self.net(b[0]), b[1])

    def configure_optimizers(self):
        import gradsift

        return gradsift.TopK(torch.optim.SGD(self.parameters(), lr=0.1), density=0.05)


def test_topk_from_configure_optimizers_and_a_warning_without_ddp():
    x, y = ddp_workers.batch(0, 0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    module = Module()
    callback = TopKHookCallback(TopKHookState(density=0.1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=3, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="no communication hook registered"):
        trainer.fit(module, data)
    opt = trainer.optimizers[0]
    assert type(opt).__name__ == "TopK" and opt.state[module.net[0].weight]["residual"].any()
    assert callback.state_dict()["ranks"][0]["iter"] == 0


@pytest.mark.parametrize("find_unused", [False, True])
def test_the_state_follows_the_strategys_find_unused_parameters(one_rank, find_unused):
    """DDP drops the hook's values for a parameter no rank used in a step; with
    find_unused_parameters=True the state holds such a parameter out of the selection
    (tests/distributed/test_unused.py)."""
    from types import SimpleNamespace

    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(torch.nn.Linear(3, 2), find_unused_parameters=find_unused)
    trainer = SimpleNamespace(strategy=SimpleNamespace(model=ddp), precision_plugin=None)
    state = TopKHookState(density=0.5)
    TopKHookCallback(state).on_fit_start(trainer, None)
    assert state.find_unused_parameters is find_unused
