"""Copy a parameter just before a validation forward writes it, so it can be put back.

The ground-truth rerun sees whether the forward writes its own weights (version counters,
memory addresses, ``.data`` taken) and, if so, runs again keeping copies. The forwards
validation runs after the capture (the completeness arm's, with escaped values perturbed,
and the one more plain call that tells a model differing from itself) can take a path the
rerun did not: a flag read with ``.item()`` and flipped re-runs a data-dependent
initialisation (Glow's ActNorm) that writes ``self.loc.data.copy_(...)``, which moves
neither the version nor the memory. Copying every weight before each such forward would
cost a pass over the model; :class:`ParamGuard` copies a parameter only at the call that
is about to write it (``p.data`` taken, an in-place method of ``p``, ``p.data = v``, an
``nn.init`` function given ``p``), once, into the :class:`ModelState` that rewinds it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["ParamGuard"]

_DATA = torch._C.TensorBase.data
_DATA_CALLS = frozenset({_DATA.__get__, _DATA.__set__})


_WRITES: dict[Any, bool] = {}  # func -> whether it may write its tensor argument


def _writes(func: Any) -> bool:
    """Whether ``func`` may write its tensor argument: ``.data`` taken or set, an in-place
    method (``copy_``, ``fill_``), an ``nn.init`` function (``normal_``)."""
    try:
        return _WRITES[func]
    except KeyError:
        name = getattr(func, "__name__", "")
        found = func in _DATA_CALLS or (name.endswith("_") and not name.endswith("__"))
        _WRITES[func] = found
        return found
    except TypeError:  # unhashable
        return False


class ParamGuard(TorchFunctionMode):
    """A mode (nothing recorded, nothing changed) under which a call that may write one of
    ``state``'s parameters first has ``state`` keep a copy of it (see
    :meth:`~torchlens.replay.ground_truth.ModelState.keep`): its next ``rewind`` puts it
    back. Push it outside the mode a forward runs under, so it sees the calls that mode
    makes."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.ids = state.param_ids()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.before(func, args, kwargs)
        return func(*args, **kwargs)

    def writes(self, func: Any) -> bool:
        """Whether ``func`` may write one of the state's parameters (a cached look-up)."""
        return bool(self.ids) and _writes(func)

    def before(self, func: Any, args: tuple, kwargs: dict) -> None:
        """Have the state keep a copy of each of its parameters ``func`` may write."""
        if self.writes(func):
            for value in (*args, *kwargs.values()):
                name = self.ids.get(id(value)) if isinstance(value, torch.Tensor) else None
                if name is not None:
                    self.state.keep(name)
