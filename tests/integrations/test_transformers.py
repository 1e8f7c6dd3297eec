"""gradsift with Hugging Face transformers: ``Trainer(optimizers=(TopK, schedule))``,
resumed from a checkpoint bit for bit. Models are built from configs (no download)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import gradsift  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=32, length=12):
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, length), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(out, steps):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    opt = gradsift.TopK(torch.optim.AdamW(model.parameters(), lr=1e-3), density=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, save_steps=3, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, report_to=[], use_cpu=True, seed=0, logging_steps=100,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), optimizers=(opt, schedule)
    )
    return trainer, model, opt


def test_trainer_with_topk_resumes_from_a_checkpoint_bit_for_bit(tmp_path):
    trainer, model, opt = _trainer(tmp_path / "full", 6)
    trainer.train()
    full = [p.detach().clone() for p in model.parameters()]
    assert any(st["residual"].any() for st in opt.state.values())
    trainer, model, _ = _trainer(tmp_path / "part", 3)
    trainer.train()
    trainer, model, _ = _trainer(tmp_path / "part", 6)
    trainer.train(resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-3"))
    for a, b in zip(full, model.parameters()):
        assert torch.equal(a, b)
