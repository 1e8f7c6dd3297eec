"""Data-parallel top-k: ``TopKHookState`` and ``topk_hook`` for
``DistributedDataParallel.register_comm_hook``."""

from gradsift.distributed.hook import TopKHookState, compress_, topk_hook

__all__ = ["TopKHookState", "topk_hook", "compress_"]
