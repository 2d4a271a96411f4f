"""The ground-truth rerun and the capture start from the same inputs and the same random
state, whatever holds them: a key-value cache of tensors that carry autograd history, or
Python's and NumPy's global generators."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens._tensors import copy_keeping_layout
from torchlens.capture import rng
from torchlens.replay.ground_truth import copy_inputs


class Cache:
    """A key-value cache as ``transformers`` keeps one: layers of objects holding tensors."""

    class Layer:
        __slots__ = ("keys",)

        def __init__(self, keys: torch.Tensor) -> None:
            self.keys = keys

    def __init__(self, keys: list[torch.Tensor]) -> None:
        self.layers = [self.Layer(k) for k in keys]

    def extend(self, i: int, new: torch.Tensor) -> torch.Tensor:
        layer = self.layers[i]
        layer.keys = torch.cat([layer.keys, new], dim=1)
        return layer.keys


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        for i, proj in enumerate(self.proj):
            keys = cache.extend(i, proj(x))
            x = x + keys.softmax(dim=1).mean(dim=1, keepdim=True)
        return x


def _cache_made_with_grad(model: Decoder) -> Cache:
    """A first step run with grad: the cached tensors are not leaves of autograd, which
    ``copy.deepcopy`` refuses."""
    cache = Cache([torch.zeros(1, 0, 4), torch.zeros(1, 0, 4)])
    model(torch.randn(1, 3, 4), cache)
    assert all(layer.keys.grad_fn is not None for layer in cache.layers)
    return cache


def test_copy_inputs_clones_tensors_hidden_in_objects_even_with_autograd_history():
    torch.manual_seed(0)
    cache = _cache_made_with_grad(Decoder())
    x = torch.randn(1, 1, 4)
    problems: list[str] = []
    (x_copy, cache_copy), kwargs = copy_inputs((x, cache), {}, problems)
    assert problems == [] and kwargs == {}
    assert cache_copy is not cache and torch.equal(x_copy, x)
    for layer, copied in zip(cache.layers, cache_copy.layers):
        assert copied is not layer and torch.equal(copied.keys, layer.keys)
        assert copied.keys.data_ptr() != layer.keys.data_ptr()
        assert copied.keys.requires_grad and copied.keys.grad_fn is not None  # not a leaf


class _OneSlot:
    __slots__ = "keys"  # a single slot may be named by a plain string

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys


def test_copy_inputs_finds_a_tensor_in_a_slot_named_by_a_string():
    held = _OneSlot(torch.randn(3, requires_grad=True) * 2)  # autograd history
    problems: list[str] = []
    (copied,), _ = copy_inputs((held,), {}, problems)
    assert problems == [] and copied is not held
    assert torch.equal(copied.keys, held.keys) and copied.keys is not held.keys


def test_copy_inputs_names_an_argument_that_cannot_be_copied():
    import threading

    x = torch.randn(2)
    problems: list[str] = []
    (x_copy, lock), _ = copy_inputs((x, threading.Lock()), {}, problems)
    assert torch.equal(x_copy, x) and x_copy is not x
    assert len(problems) == 1 and "could not be copied (TypeError" in problems[0]


def test_a_second_step_on_a_cache_made_with_grad_validates_and_extends_it_once():
    torch.manual_seed(0)
    model = Decoder().eval()
    cache = _cache_made_with_grad(model)
    status = tl.replay(model, (torch.randn(1, 1, 4), cache))
    assert status.state == "passed", status
    assert [layer.keys.shape[1] for layer in cache.layers] == [4, 4]  # one plain step: 3 + 1


class DrawsOnTheHost(nn.Module):
    """Masks drawn from NumPy (as SpecAugment in ``transformers``) and a layer dropped by
    Python's ``random`` (as LayerDrop)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.from_numpy(np.random.rand(8) > 0.5)
        for layer in self.layers:
            if random.random() < 0.5:
                x = torch.tanh(layer(x))
        return x.sum()


def test_a_forward_drawing_from_numpy_and_random_validates():
    torch.manual_seed(0)
    model = DrawsOnTheHost().eval()
    x = torch.randn(2, 8)
    for seed in range(5):
        np.random.seed(seed)
        random.seed(seed)
        status = tl.replay(model, (x,))
        assert status.state == "passed", status
        after = (np.random.get_state()[1].copy(), random.getstate())
        np.random.seed(seed)
        random.seed(seed)
        model(x)  # the host generators are left as one plain forward leaves them
        assert np.array_equal(after[0], np.random.get_state()[1])
        assert after[1] == random.getstate()


def test_backward_validation_of_a_forward_drawing_from_numpy_and_random():
    torch.manual_seed(0)
    np.random.seed(3)
    random.seed(3)
    status = tl.replay(DrawsOnTheHost(), (torch.randn(2, 8),), scope="backward")
    assert status.state == "passed", status


def test_a_host_snapshot_restores_python_and_numpy_and_a_trace_keeps_torch_only():
    state = rng.snapshot(host=True)
    assert {"cpu", "python", "numpy"} <= set(state)
    drawn = (random.random(), np.random.rand(), torch.rand(1))
    caller = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with rng.restored(state):
        again = (random.random(), np.random.rand(), torch.rand(1))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])
    assert random.getstate() == caller[0]  # the caller's states come back after the block
    assert np.array_equal(np.random.get_state()[1], caller[1])
    assert torch.equal(torch.get_rng_state(), caller[2])
    trace = tl.trace(nn.Linear(2, 2), torch.randn(1, 2))
    assert set(trace.rng_state) == {"cpu"}


class SharedNorm(nn.Module):
    """One BatchNorm under two names (performer-pytorch keeps its network twice so): its
    running statistics are listed under both, and the forward updates them in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.alias = self.bn
        self.again = nn.ModuleList([self.bn])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def test_a_buffer_under_several_names_is_rewound_once_and_validates():
    torch.manual_seed(0)
    model, x = SharedNorm().train(), torch.randn(8, 4)
    status = tl.replay(model, (x,))
    assert status.state == "passed", status
    reference = SharedNorm().train()
    reference.load_state_dict(SharedNorm().state_dict())  # fresh statistics
    reference(x)  # the model is left as one plain forward leaves it
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
    assert int(model.bn.num_batches_tracked) == 1


class StaticCache:
    """transformers' StaticCache in small: preallocated keys written in place by index."""

    def __init__(self) -> None:
        self.keys = torch.zeros(3, 4)


class WritesIntoTheCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, cache: StaticCache, position: torch.Tensor):
        cache.keys.index_copy_(0, position, self.fc(x))
        return cache.keys.softmax(0).sum(0)


def test_a_cache_with_autograd_history_written_in_place_validates():
    torch.manual_seed(0)
    model, cache = WritesIntoTheCache().eval(), StaticCache()
    model(torch.randn(1, 4), cache, torch.tensor([0]))  # a first step with grad
    assert cache.keys.grad_fn is not None
    (_, copied, _), _ = copy_inputs((torch.randn(1), cache, torch.tensor([1])), {})
    assert copied.keys.grad_fn is not None and copied.keys is not cache.keys  # not a leaf
    status = tl.replay(model, (torch.randn(1, 4), cache, torch.tensor([1])))
    assert status.state == "passed", status
    assert bool((cache.keys[2] == 0).all()) and not bool((cache.keys[1] == 0).all())


class Rebinds(nn.Module):
    """accelerate's offload hooks in small: every call binds new Parameter objects holding
    the same values, and parks a copy of the output on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.kept = {k: v.detach().clone() for k, v in self.fc.named_parameters()}
        self.fc.register_forward_pre_hook(self.load)

    def load(self, module: nn.Module, args: tuple) -> None:
        for name, value in self.kept.items():
            module._parameters[name] = nn.Parameter(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.parked = y.to("meta")
        return y.relu()


def test_parameters_rebound_to_the_same_values_and_meta_outputs_validate():
    torch.manual_seed(0)
    model = Rebinds().eval()
    status = tl.replay(model, (torch.randn(2, 4),))
    assert status.state == "passed", status
    assert status.exempt == 1  # the edge into the meta copy: no values to move

    class Retrains(Rebinds):  # new objects with new values at every call, and never the
        calls = 0  # same values twice: no rerun can start where the capture starts

        def load(self, module: nn.Module, args: tuple) -> None:
            self.calls += 1
            for name, value in self.kept.items():
                module._parameters[name] = nn.Parameter(value + self.calls)

    status = tl.replay(Retrains().eval(), (torch.randn(2, 4),))
    assert status.state == "unverified"
    assert "modified parameter(s) ['fc.weight', 'fc.bias']" in str(status)


class RescalesOnce(nn.Module):
    """RWKV in small: the first call in eval mode rescales some weights in place, once."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.rescaled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and not self.rescaled:
            with torch.no_grad():
                self.fc.weight.div_(2.0)
            self.rescaled = True
        return self.fc(x).relu()


class DecaysEveryCall(nn.Module):
    """A forward that writes its weight at every call (a decay applied in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.fc.weight.mul_(0.5)
        return self.fc(x).relu()


@pytest.mark.parametrize("make", [RescalesOnce, DecaysEveryCall], ids=["once", "every_call"])
def test_a_forward_writing_its_weights_is_checked_from_the_weights_it_left(make):
    torch.manual_seed(0)
    model, plain = make().eval(), make().eval()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 4)
    status = tl.replay(model, (x,))
    assert status.state == "passed", status
    assert status.unverified == 0
    plain(x)  # the weights end as one plain forward leaves them
    torch.testing.assert_close(model.fc.weight, plain.fc.weight, rtol=0, atol=0)


class Accumulates(nn.Module):
    """torchmetrics in small: running state in plain tensor attributes, not buffers, one
    rebound at each call and one written in place; the output reads both."""

    def __init__(self) -> None:
        super().__init__()
        self.total = torch.zeros(())
        self.calls = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total = self.total + x.sum()
        self.calls += 1
        return self.total / self.calls


def test_tensor_attributes_are_rewound_for_the_capture_and_left_as_one_forward_leaves_them():
    model, plain, x = Accumulates(), Accumulates(), torch.randn(5)
    status = tl.replay(model, (x,))
    # the capture starts where the rerun did: otherwise it reads state advanced by it
    assert status.state == "passed", status
    plain(x)
    assert torch.equal(model.total, plain.total) and torch.equal(model.calls, plain.calls)


def test_a_frozen_transformer_encoder_is_rerun_on_the_path_the_capture_took():
    # without grad, nn.TransformerEncoderLayer takes a fused fast path, unless a torch
    # function mode is active (as under the capture): with a padding mask that path
    # returns zeros at padded positions, so the plain rerun and the capture differ
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2).eval().requires_grad_(False)
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[-1, 4:] = True
    status = tl.replay(model, (x,), {"src_key_padding_mask": pad})
    assert status.state == "passed", status


def test_a_broadcast_input_is_copied_with_its_strides():
    # linear takes another kernel for a contiguous 3-d input than for an expanded one,
    # and in bfloat16 the two round apart: the copies replay and the rerun run on keep
    # the input's layout (clone() would make it contiguous)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    model = model.to(torch.bfloat16).eval()
    x = torch.randn(1, 16, 64, dtype=torch.bfloat16).expand(4, 16, 64)
    status = tl.replay(model, (x,))
    assert status.state == "passed", status
    copy = copy_keeping_layout(x)
    assert copy.stride() == x.stride() and torch.equal(copy, x)
    sliced = torch.randn(4, 10)[:, ::2]
    assert copy_keeping_layout(sliced).stride() == sliced.stride()
    assert copy_keeping_layout(torch.randn(100, 100)[:2, :2]).is_contiguous()  # a corner


class DrawsFromItsOwnGenerator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(5)

    def forward(self, x):
        return x + torch.randn(x.shape, generator=self.gen)


def test_a_generator_the_model_holds_starts_both_runs_alike_and_ends_as_after_one():
    model, x = DrawsFromItsOwnGenerator(), torch.randn(3)
    start = model.gen.get_state()
    status = tl.replay(model, (x,))
    assert status.state == "passed", status  # the rerun's draw was not the capture's start
    plain = torch.Generator()
    plain.set_state(start)
    torch.randn(3, generator=plain)
    assert torch.equal(model.gen.get_state(), plain.get_state())


class MultipliesBySparse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 3))
        index = torch.tensor([[0, 1, 1, 3], [2, 0, 4, 1]])
        self.register_buffer("a", torch.sparse_coo_tensor(index, torch.randn(4), (4, 5)))

    def forward(self, x):
        return torch.sparse.mm(self.a, self.w) + x


def test_a_sparse_buffer_is_compared_not_refused():
    status = tl.replay(MultipliesBySparse(), (torch.randn(4, 3),))  # raised NotImplementedError
    assert status.state == "passed", status
