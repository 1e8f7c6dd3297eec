"""Data-parallel top-k: ``TopKHookState`` and ``topk_hook`` for
``DistributedDataParallel.register_comm_hook``."""

from gradsift.distributed.cost import crossover_density, sparse_pays
from gradsift.distributed.hook import TopKHookState, compress_, topk_hook
from gradsift.distributed.warmup import dgc_warmup

__all__ = [
    "TopKHookState",
    "compress_",
    "crossover_density",
    "dgc_warmup",
    "sparse_pays",
    "topk_hook",
]
