"""The built-in criteria, one file each; importing this package registers them."""

from gradsift.pruning.methods import (  # noqa: F401
    force,
    grasp,
    iter_snip,
    magnitude,
    ntk_sap,
    prospr,
    random_scores,
    snip,
    synflow,
    synflow_l2,
)
