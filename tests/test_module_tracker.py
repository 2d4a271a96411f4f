"""One module tracker per capture (issue 49): ``ModuleTracker`` installs every mechanism
that follows module calls and removes all of them on ``exit()``, whatever the policy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture.hooks import ModuleTracker
from torchlens.capture.roots import resolve_root
from torchlens.capture.session import suspended


class _Calls:
    """A capture policy that only notes the module calls it is handed."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def traced_forward(self, module, address, forward):
        def forward_noted(*args, **kwargs):
            self.seen.append(address)
            return forward(*args, **kwargs)

        return forward_noted

    def enter_own(self, address, module, args, kwargs):
        self.seen.append(address)

    def exit_own(self, module, args, kwargs, output):
        return None


def _model() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[2].register_forward_hook(lambda m, a, o: None)  # hooks of its own: a hook pair
    return model


def test_enter_follows_every_module_call_and_exit_removes_every_mechanism():
    model, calls, tracker = _model(), _Calls(), ModuleTracker()
    hooks_before = (dict(model[2]._forward_pre_hooks), dict(model[2]._forward_hooks))
    tracker.enter(resolve_root(model), calls, None)
    assert tracker.on and "forward" in model[0].__dict__
    model(torch.randn(1, 4))
    assert calls.seen == ["0", "1", "2"]
    tracker.exit()
    assert not tracker.on
    assert all("forward" not in m.__dict__ for m in model)
    assert (dict(model[2]._forward_pre_hooks), dict(model[2]._forward_hooks)) == hooks_before
    model(torch.randn(1, 4))
    assert calls.seen == ["0", "1", "2"]  # nothing followed after exit
    tracker.exit()  # a second exit removes nothing twice


def test_a_traced_function_follows_modules_outside_any_root_until_exit():
    inner, calls, tracker = nn.Linear(4, 4), _Calls(), ModuleTracker()
    call = nn.Module.__call__
    tracker.enter(resolve_root(lambda x: inner(x)), calls, None)
    assert nn.Module.__call__ is not call  # the follower is installed
    inner(torch.randn(1, 4))
    tracker.exit()
    assert nn.Module.__call__ is call
    assert len(calls.seen) == 1


class LooksAside(nn.Module):
    """Runs its ``side`` module once with the capture suspended (a reference run)."""

    def __init__(self) -> None:
        super().__init__()
        self.main, self.side = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        with suspended():
            self.side(x)
        return self.main(x).relu()


@pytest.mark.parametrize("capture", ["trace", "record"])
def test_a_suspended_block_is_not_followed_and_the_capture_goes_on(capture):
    model, x = LooksAside(), torch.randn(2, 4)
    if capture == "trace":
        trace = tl.trace(model, x)
        assert [call.address for call in trace.module_calls("*")] == ["", "main"]  # no "side"
        ops = list(trace)
    else:
        ops = list(tl.record(model, x, save=tl.where(lambda op: True)))
    assert [(op.label, tuple(op.module_stack)) for op in ops] == [
        ("linear_1", (("main", 1),)),
        ("relu_1", ()),
    ]


def test_suspended_resumes_after_an_error():
    tracker = ModuleTracker()
    tracker.on = True
    with pytest.raises(RuntimeError), tracker.suspended():
        assert not tracker.on
        raise RuntimeError("the block's error")
    assert tracker.on


@pytest.mark.parametrize("capture", ["trace", "record"])
def test_every_capture_leaves_no_mechanism_behind_even_when_the_model_raises(capture):
    class Raises(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).view(7)  # a shape error inside the forward

    model = Raises()
    run = tl.trace if capture == "trace" else lambda m, x: tl.record(m, x, save=tl.func("relu"))
    with pytest.raises(RuntimeError):
        run(model, torch.randn(1, 4))
    assert "forward" not in model.lin.__dict__ and "forward" not in model.__dict__
