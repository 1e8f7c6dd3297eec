"""A run's spec: its sanity variant and the key that finds it again in a results file."""

import pytest

from gradsift.lab.specs import RunSpec


def test_keys_of_older_results_still_match():
    old = RunSpec(method="snip", sparsity=0.9, shuffle=True)
    assert old.key() == "lenet5|digits|snip|0.9|1|1|0|10|None|None|1|0.05|64"
    assert RunSpec(method="snip", sparsity=0.9, sanity="shuffle-layer").key() == old.key()
    assert RunSpec(method="snip", sparsity=0.9).key().endswith("|0.05|64")
    erk = RunSpec(method="snip", sparsity=0.9, allocation="erk", sanity="reinit").key()
    assert erk.endswith("|0.05|64|budget=erk|sanity=reinit")  # the old spelling, kept


def test_sparsities_that_print_alike_are_distinct_keys():
    assert RunSpec(sparsity=0.999999).key() != RunSpec(sparsity=0.99999944).key()
    assert "|0.9|" in RunSpec(sparsity=0.9).key()  # short where short is exact


def test_variant_is_layerwise_shuffling_or_the_sanity_named():
    assert RunSpec().variant is None
    assert RunSpec(shuffle=True).variant == "shuffle-layer"
    assert RunSpec(sanity="reinit").variant == "reinit"
    with pytest.raises(ValueError, match="shuffle=True is sanity='shuffle-layer', not 'reinit'"):
        _ = RunSpec(shuffle=True, sanity="reinit").variant


def test_the_optimizer_settings_and_device_are_in_the_key_where_not_the_defaults():
    from gradsift.lab.training import TrainConfig

    plain = RunSpec(model="mlp", train=TrainConfig(epochs=2)).key()
    assert plain == "mlp|digits|None|0|1|0|0|2|None|None|1|0.05|64"  # as older results
    others = [
        TrainConfig(epochs=2, momentum=0.0),
        TrainConfig(epochs=2, weight_decay=0.0),
        TrainConfig(epochs=2, schedule="none"),
        TrainConfig(epochs=2, device="cuda"),
    ]
    keys = [RunSpec(model="mlp", train=t).key() for t in others]
    assert len({plain, *keys}) == 5, keys
    assert keys[0] == plain + "|momentum=0"
