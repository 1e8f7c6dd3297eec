"""The criteria registry: names, options, defaults, and a user's own criterion."""

import pytest
import torch

import gradsift
from gradsift.pruning import method_options, register_method, supported_options
from gradsift.pruning.params import effective, original, prunable
from gradsift.pruning.registry import _METHODS, checked_options, get_method
from pruning_support import batches, mlp


def test_list_and_errors():
    assert gradsift.list_methods() == [
        *("force", "grasp", "iter_snip", "magnitude", "ntk_sap", "prospr", "random"),
        *("snip", "synflow", "synflow_l2"),
    ]
    with pytest.raises(ValueError, match="needs data"):
        gradsift.score(mlp(), "snip")
    with pytest.raises(ValueError, match="method must be one of"):
        gradsift.score(mlp(), "l1")
    with pytest.raises(TypeError, match="unknown options"):
        gradsift.score(mlp(), "magnitude", temperature=3)
    assert "samples_per_class" in method_options("grasp")
    assert supported_options("random", seed=3, num_classes=10) == {"seed": 3}
    assert supported_options("grasp", seed=3, num_classes=10) == {"num_classes": 10}


@pytest.fixture
def square_method():
    def squared(model, targets, data=None, *, power: int = 2):
        return {name: effective(m, a).abs() ** power for name, (m, a) in targets.items()}

    register_method("squared", squared, defaults={"power": 4})
    yield squared
    del _METHODS["squared"]


def test_iterative_rounds_of_a_rescorer_leave_the_global_generator_alone():
    # a rescorer (cheap rounds: SynFlow, NTK-SAP) that draws from the global generator
    # while prune_at_init builds and calls it: the caller's generator is as it was
    def drawn(model, targets, data=None):
        return {name: torch.rand(original(m, a).shape) for name, (m, a) in targets.items()}

    def rescorer(model, data, *, params=None):
        targets = prunable(model, params, warn=False)
        torch.rand(3)
        return lambda masks: drawn(model, targets)

    register_method("drawn", drawn, rescorer=rescorer)
    try:
        model = mlp()  # (seeds the generator itself)
        torch.manual_seed(5)
        state = torch.get_rng_state()
        gradsift.prune_at_init(model, "drawn", 0.8, iterations=3)
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        del _METHODS["drawn"]


def test_a_user_criterion_plugs_in(square_method):
    model = mlp()
    assert "squared" in gradsift.list_methods()
    scores = gradsift.score(model, "squared")
    torch.testing.assert_close(scores["1.weight"], model[1].weight.abs() ** 4)  # its default
    scores = gradsift.score(model, "squared", power=1)
    torch.testing.assert_close(scores["1.weight"], model[1].weight.abs())
    masks = gradsift.prune_at_init(model, "squared", 0.5)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.5 * total)
    with pytest.raises(ValueError, match="already registered"):
        register_method("squared", square_method)


def test_register_validates():
    with pytest.raises(ValueError, match="not keyword-only options"):
        register_method("bad", lambda model, targets, data=None: {}, defaults={"x": 1})
    with pytest.raises(TypeError, match="callable"):
        register_method("bad", 3)
    register_method("broken", lambda model, targets, data=None: {"nope": torch.ones(1)})
    try:
        with pytest.raises(ValueError, match="must return scores for"):
            gradsift.score(mlp(), "broken")
    finally:
        del _METHODS["broken"]
    numpy = lambda model, targets, data=None: {n: [0.0] for n in targets}  # noqa: E731
    register_method("listed", numpy)
    try:
        with pytest.raises(TypeError, match="method 'listed': score of 1.weight must be a tensor"):
            gradsift.score(mlp(), "listed")
    finally:
        del _METHODS["listed"]


def test_an_option_the_callers_take_for_themselves_never_hides():
    """score's own warn is not a method option (unknown, as any other), and a custom
    option named as one of score's or prune_at_init's arguments (which would never
    reach the method) is refused at registration."""
    with pytest.raises(TypeError, match=r"unknown options \['warn'\]"):
        gradsift.score(mlp(), "random", warn=False)

    def taker(model, targets, data=None, *, iterations=1):
        return {n: torch.ones_like(original(m, a)) for n, (m, a) in targets.items()}

    with pytest.raises(ValueError, match=r"options \['iterations'\] of 'taker'"):
        register_method("taker", taker)
    assert "taker" not in _METHODS


def test_checked_options_fill_in_the_criterions_own_defaults(square_method):
    # a rescorer gets every option with its value, registered defaults over fn's own
    assert checked_options("squared", {}) == {"power": 4}
    assert checked_options("squared", {"power": 1}) == {"power": 1}
    assert checked_options("ntk_sap", {"seed": 3})["epsilon"] == 0.01
    assert checked_options("ntk_sap", {"seed": 3})["seed"] == 3


def test_a_criterion_with_a_sparsity_option_gets_each_rounds_target():
    seen = []

    def targeted(model, targets, data=None, *, sparsity: float = 0.5):
        seen.append(sparsity)
        return {name: effective(m, a).abs() for name, (m, a) in targets.items()}

    register_method("targeted", targeted)
    try:
        assert get_method("targeted").takes_sparsity
        assert not get_method("snip").takes_sparsity
        gradsift.prune_at_init(mlp(), "targeted", 0.75, iterations=2)
        assert seen == [0.5, 0.75]  # 1 - 0.25 ** (1/2), then the target
        gradsift.prune_at_init(mlp(), "targeted", 0.2, schedule="linear", iterations=2)
        assert seen[2:] == [0.1, 0.2]
    finally:
        del _METHODS["targeted"]


def test_scoring_a_plain_model_does_not_load_dtensor():
    """Telling a sharded model from a plain one imports nothing: loading
    ``torch.distributed.tensor`` costs tens of MB of resident memory."""
    import subprocess
    import sys

    code = (
        "import sys, torch, gradsift\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "gradsift.prune_at_init(m, 'magnitude', 0.5)\n"
        "gradsift.score(m, 'snip', [(torch.randn(2, 4), torch.tensor([0, 1]))])\n"
        "assert 'torch.distributed.tensor' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _masks(scores, sparsity, **options):
    return gradsift.masks_from_scores(scores, sparsity, **options)


BAD_ARGUMENTS = [  # (call, error, message), each before any work
    (lambda: gradsift.score(mlp(), "snip", batches(), num_batches=0), ValueError,
     "num_batches must be >= 1, got 0"),
    (lambda: gradsift.score(mlp(), "force", batches(), num_batches=-1), ValueError,
     "num_batches must be >= 1, got -1"),
    (lambda: gradsift.score(mlp(), "grasp", batches(), temperature=0.0), ValueError,
     r"temperature must be in \(0, inf\), got 0.0"),
    (lambda: gradsift.score(mlp(), "grasp", batches(), num_classes=0), ValueError,
     "num_classes must be >= 1, got 0"),
    (lambda: gradsift.score(mlp(), "ntk_sap", batches(), batch_size=0), ValueError,
     "batch_size must be >= 1, got 0"),  # not the data's batch size in its place
    (lambda: gradsift.score(mlp(), "ntk_sap", input_shape=12, batch_size=4), TypeError,
     r"input_shape must be a tuple of ints like \(3, 32, 32\), got 12"),
    (lambda: gradsift.score(mlp(), "synflow", input_shape=12), TypeError,
     "input_shape must be a tuple"),
    (lambda: gradsift.score(mlp(), "synflow", input_shape=(12,), dtype="float32"), TypeError,
     "synflow: dtype must be a floating torch.dtype, got 'float32'"),
    (lambda: gradsift.score(mlp(), "random", seed=1.5), TypeError,
     "seed must be an int, got float"),
    (lambda: gradsift.score(mlp(), "ntk_sap", input_shape=(12,), batch_size=4, seed=1.5), TypeError,
     "seed must be an int, got float"),  # not torch's manual_seed error
    (lambda: gradsift.prune_at_init(mlp(), "ntk_sap", 0.5, input_shape=(12,), batch_size=4,
     seed=True, iterations=2), TypeError, "seed must be an int, got bool"),
    (lambda: gradsift.prune_at_init(mlp(), "random", 0.5, sanity="shuffle-layer", generator=3),
     TypeError, "generator must be a torch.Generator, got 3"),
    (lambda: _masks({}, 0.5), ValueError, "scores is empty"),
    (lambda: _masks({"a": torch.ones(3)}, 0.5, previous={"a": torch.ones(4)}), ValueError,
     r"previous mask for scores\['a'\] has shape \(4,\), the score \(3,\)"),
]  # fmt: skip


@pytest.mark.parametrize("call, error, message", BAD_ARGUMENTS)
def test_a_bad_argument_is_an_error_naming_it(call, error, message):
    with pytest.raises(error, match=message):
        call()
