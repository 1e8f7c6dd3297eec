"""A ``torch.optim.Optimizer`` over another optimizer's parameters: what ``TopK``
needs from torch's protocol besides its step (private).

The inner optimizer owns ``param_groups`` and ``defaults``, read live (its
``load_state_dict`` replaces the ``param_groups`` list); the wrapper has its own hook
dictionaries, so ``register_step_pre_hook`` and the like work on it, and it copies
(``copy.deepcopy``) and pickles with every attribute but its hooks and those a
subclass rebuilds.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.optim import Optimizer

__all__ = ["OptimizerWrapper"]

_HOOK_DICTS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


class OptimizerWrapper(Optimizer):
    """Set ``optimizer`` with ``_wrap``; a subclass names the attributes a copy drops
    (``_transient``) and rebuilds them in ``_after_copy``."""

    _transient: tuple[str, ...] = ()

    def _wrap(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._patch_step_function()

    def _after_copy(self) -> None:
        """Rebuild the ``_transient`` attributes after ``copy.deepcopy`` or unpickling."""

    def __getstate__(self) -> dict:
        """What ``copy.deepcopy`` and pickle keep: every attribute but ``_transient``,
        the hooks and an instance ``step`` (an LR scheduler's patch, bound to the
        original through a weak reference), which torch's ``Optimizer.__getstate__``
        drops too (it keeps only defaults, state and param_groups)."""
        dropped = {*self._transient, *_HOOK_DICTS, "step"}
        return {k: v for k, v in self.__dict__.items() if k not in dropped}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name in self._transient:
            setattr(self, name, None)
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._patch_step_function()
        self._after_copy()

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict) -> None:
        self.optimizer.defaults = value

    def _name(self, p: torch.Tensor) -> str:
        """How errors name ``p``: its ``param_names`` entry, or its place in the groups."""
        for gi, group in enumerate(self.param_groups):
            for i, q in enumerate(group["params"]):
                if q is p:
                    names = group.get("param_names")
                    where = names[i] if names else f"param_groups[{gi}]['params'][{i}]"
                    return f"{where} (shape {tuple(p.shape)})"
        return f"parameter of shape {tuple(p.shape)}"

    def _with_state_dict_hooks(self, make) -> dict:
        """``make()`` between the hooks registered with ``register_state_dict_pre_hook``
        and ``..._post_hook`` (a post hook may return a replacement), as torch runs them."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        state_dict = make()
        for hook in self._optimizer_state_dict_post_hooks.values():
            result = hook(self, state_dict)
            state_dict = state_dict if result is None else result
        return state_dict

    def _with_load_state_dict_hooks(self, state_dict: dict, load) -> None:
        """``load(state_dict)`` between the load_state_dict pre hooks (which may return
        a replacement dict) and post hooks, as torch runs them: on a shallow copy, so
        that a hook rewriting an entry leaves the caller's checkpoint as it was."""
        state_dict = state_dict.copy()
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            state_dict = state_dict if result is None else result
        load(state_dict)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)
