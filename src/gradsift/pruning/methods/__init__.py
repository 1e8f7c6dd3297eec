"""The built-in criteria, one file each; importing this package registers them."""

from gradsift.pruning.methods import (  # noqa: F401
    grasp,
    magnitude,
    random_scores,
    snip,
    synflow,
)
