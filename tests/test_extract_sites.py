"""tl.extract: which sites a batch gives and under which names (a module's address for what a
selected call returned), a site no batch may drop silently, what older runs on disk become,
the interval flush, the signal handlers of a run, and the resumed progress bar."""

from __future__ import annotations

import json
import signal
import threading

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import torchlens as tl
from torchlens.errors import ExtractionError, LookupFailedError
from torchlens.extract import _signals, _store


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.lin(x)  # a residual block: its last op is what it returns


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return self.head(x)


def _stack() -> Stack:
    torch.manual_seed(0)
    return Stack().eval()


X = [torch.randn(5, 4, generator=torch.Generator().manual_seed(k)) for k in range(3)]


def _block_outputs(model: Stack) -> dict[str, torch.Tensor]:
    """Each block's output for all of X, from forward hooks."""
    rows: dict[str, list[torch.Tensor]] = {f"h.{i}": [] for i in range(3)}
    for i, block in enumerate(model.h):
        block.register_forward_hook(lambda m, a, out, i=i: rows[f"h.{i}"].append(out))
    with torch.no_grad():
        for x in X:
            model(x)
    return {k: torch.cat(v) for k, v in rows.items()}


def test_output_selector_with_stop_after_keeps_every_block_it_reaches(tmp_path):
    model = _stack()
    save, stop = tl.module(type=Block).output, tl.label("add_2")
    rec = tl.record(model, X[0], save=save, stop_after=stop)
    assert rec.labels == ["add_1", "add_2"] and rec.halted and rec.output is None
    assert rec["add_2"].returned_by == (("h.1", 1, "Block"),)  # h.1 returned it, then halt
    assert rec.meta["n_ops"] == 4  # linear, add, linear, add: the head never ran
    ex = tl.extract(model, X, save=save, stop_after=stop, to=tmp_path / "run", progress=False)
    assert list(ex) == ["h.0", "h.1"]  # add_2 (h.1's output) used to be dropped
    expected = _block_outputs(_stack())
    for site in ex:
        torch.testing.assert_close(ex[site][:], expected[site])
    assert ex.meta["site_ops"] == {"h.0": "add_1", "h.1": "add_2"}


def test_record_counts_ops_alike_with_or_without_an_output_rule():
    model = _stack()
    by_output = tl.record(model, X[0], save=tl.module(type=Block).output)
    by_func = tl.record(model, X[0], save=tl.func("add"))
    trace = tl.trace(model, X[0])
    # the exit bookkeeping's own detach used to be counted as 3 more ops
    assert by_output.meta["n_ops"] == by_func.meta["n_ops"] == len(trace.ops) == 7


def test_module_sites_are_named_by_address_others_by_label(tmp_path):
    model = _stack()
    save = tl.module(type=Block).output | tl.func("linear")
    ex = tl.extract(model, X, save=save, to=tmp_path / "run", progress=False,
                    reduce={"h.2": lambda t: t * 0})  # fmt: skip
    assert list(ex) == ["linear_1", "h.0", "linear_2", "h.1", "linear_3", "h.2", "linear_4"]
    expected = _block_outputs(_stack())
    torch.testing.assert_close(ex["h.1"][:], expected["h.1"])
    assert torch.equal(ex["h.2"][:], torch.zeros(15, 4))  # reduce= keyed by the address
    assert ex.meta["args"]["site_names"] == "module address"
    with pytest.raises(LookupFailedError, match="'add_2' is stored as 'h.1'"):
        ex["add_2"]


class Shared(nn.Module):
    """One block called twice, and a wrapper returning its last child's output."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.tail = nn.Sequential(nn.ReLU(), nn.Linear(4, 3))

    def forward(self, x):
        return self.tail(self.block(self.block(x)))


def test_a_call_per_site_for_shared_modules_and_both_names_for_one_value(tmp_path):
    torch.manual_seed(0)
    model = Shared().eval()
    save = tl.module("block").output | tl.module("tail*").output
    ex = tl.extract(model, X, save=save, to=tmp_path / "run", progress=False)
    assert list(ex) == ["block:1", "block:2", "tail.0", "tail.1", "tail"]
    assert torch.equal(ex["tail"][:], ex["tail.1"][:])  # one op, returned by both calls
    with torch.no_grad():
        once = torch.cat([model.block(x) for x in X])
        torch.testing.assert_close(ex["block:1"][:], once)
        torch.testing.assert_close(ex["tail"][:], torch.cat([model(x) for x in X]))


class Optional(nn.Module):
    """Runs its second block only for batches of more than 2 examples."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Block(), Block()

    def forward(self, x):
        x = self.first(x)
        return self.second(x) if x.shape[0] > 2 else x


def test_a_site_a_batch_does_not_produce_is_a_typed_error_naming_it(tmp_path):
    batches = [torch.randn(4, 4), torch.randn(2, 4), torch.randn(4, 4)]
    torch.manual_seed(0)
    with pytest.raises(ExtractionError) as err:
        tl.extract(Optional().eval(), batches, save=tl.module("*").output,
                   to=tmp_path / "run", progress=False)  # fmt: skip
    assert err.value.code == "sites_changed"
    assert "batch 1 did not produce site(s) ['second.lin', 'second']" in str(err.value)
    assert _store.done_batches(tmp_path / "run") == {0}  # the batch before it is kept


def _older(run) -> None:
    """Make ``run`` look written by a torchlens that named module outputs by op label."""
    record = json.loads((run / "run.json").read_text())
    del record["args"]["site_names"]
    (run / "run.json").write_text(json.dumps(record))


def test_runs_of_older_torchlens_load_as_they_are_and_are_not_resumed_under_new_names(
    tmp_path,
):
    model, save = _stack(), tl.module(type=Block).output
    finished = tmp_path / "finished"
    tl.extract(model, X, save=save, to=finished, progress=False)
    _older(finished)
    assert list(tl.load_extraction(finished)) == ["h.0", "h.1", "h.2"]  # read as written
    with pytest.raises(ExtractionError) as err:
        tl.extract(model, X, save=save, to=finished, progress=False)
    assert err.value.code == "exists" and "named each module output by its op label" in str(
        err.value
    )
    unfinished = tmp_path / "unfinished"
    tl.extract(model, X, save=save, to=unfinished, progress=False)
    (unfinished / "manifest.json").unlink()
    _older(unfinished)
    with pytest.raises(ExtractionError) as err:
        tl.extract(model, X, save=save, to=unfinished, progress=False)
    assert err.value.code == "args_changed" and "cannot be continued" in str(err.value)
    ex = tl.extract(model, X, save=save, to=unfinished, progress=False, overwrite=True)
    assert list(ex) == ["h.0", "h.1", "h.2"]


def test_the_writer_flushes_once_the_oldest_row_held_is_flush_s_old(tmp_path, monkeypatch):
    (tmp_path / "shards").mkdir()
    now = [100.0]
    monkeypatch.setattr(_store.time, "monotonic", lambda: now[0])
    writer = _store.ShardWriter(tmp_path, limit=1 << 30, every=30.0)
    rows = {"a": torch.ones(2, 3)}
    writer.add(0, 0, 2, rows)
    now[0] += 29.9
    writer.add(1, 2, 2, rows)
    assert _store.done_batches(tmp_path) == set()  # under 30 s and under the size limit
    now[0] += 0.1
    writer.add(2, 4, 2, rows)
    assert _store.done_batches(tmp_path) == {0, 1, 2}
    writer.add(3, 6, 2, rows)  # the clock starts again with the next batch held
    now[0] += 29.0
    writer.add(4, 8, 2, rows)
    assert _store.done_batches(tmp_path) == {0, 1, 2}
    by_size = _store.ShardWriter(tmp_path, limit=1 << 30, every=None)
    by_size.add(5, 10, 2, rows)
    now[0] += 1e6
    by_size.add(6, 12, 2, rows)
    assert _store.done_batches(tmp_path) == {0, 1, 2}


def test_a_signal_during_a_shard_write_waits_for_it_to_end():
    guard = _signals.Guard()
    with pytest.raises(_signals.Terminated):
        with guard.writing():
            guard.handler(signal.SIGTERM, None)  # deferred: the write goes on
            finished = True
    assert finished
    with pytest.raises(KeyboardInterrupt):
        with guard.writing():
            guard.handler(signal.SIGINT, None)
    with pytest.raises(_signals.Terminated):
        guard.handler(signal.SIGTERM, None)  # outside a write: at once


def _handlers() -> tuple:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


@pytest.fixture
def interactive_sigint():
    """SIGINT as an interactive Python has it (``KeyboardInterrupt``): a process started in
    the background of a shell without job control (``cmd &``, as CI may run the tests)
    starts with SIGINT ignored, which ``tl.extract`` keeps as it is."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_the_handlers_are_the_runs_only_while_it_runs(tmp_path, interactive_sigint):
    before, seen = _handlers(), []
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    model[1].register_forward_pre_hook(lambda m, a: seen.append(_handlers()))
    tl.extract(model, X, save=tl.func("relu"), to=tmp_path / "ok", progress=False)
    assert seen and all(h != b for h, b in zip(seen[0], before)) and _handlers() == before
    with pytest.raises(ExtractionError):  # a batch the model rejects
        tl.extract(model, [torch.ones(2, 5)], save=tl.func("relu"), to=tmp_path / "bad")
    assert _handlers() == before
    interrupted, n = tmp_path / "interrupted", [0]

    def ctrl_c(module, args):
        n[0] += 1
        if n[0] == 2:  # in the second batch
            signal.raise_signal(signal.SIGINT)

    model[0].register_forward_pre_hook(ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        tl.extract(model, X, save=tl.func("relu"), to=interrupted, progress=False)
    assert _handlers() == before
    assert _store.done_batches(interrupted) == {0}  # the first batch was written on the way out
    result = []
    thread = threading.Thread(target=lambda: result.append(
        tl.extract(nn.ReLU(), X, save=tl.func("relu"), to=tmp_path / "thread", progress=False)
    ))  # fmt: skip
    thread.start()
    thread.join()
    assert result and result[0].n_examples == 15 and _handlers() == before


def test_an_ignored_sigint_stays_ignored_through_a_run(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup or `cmd &`
    try:
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        seen = []

        def ctrl_c(module, args):  # in every batch
            seen.append(signal.getsignal(signal.SIGINT))
            signal.raise_signal(signal.SIGINT)

        model[0].register_forward_pre_hook(ctrl_c)
        run = tl.extract(model, X, save=tl.func("relu"), to=tmp_path / "run", progress=False)
        assert seen == [signal.SIG_IGN] * 3 and run.n_examples == 15  # Ctrl-C did not stop it
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_handler_of_the_scripts_own_runs_after_the_rows_are_written(tmp_path):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        n = [0]

        def term(module, args):
            n[0] += 1
            if n[0] == 2:
                signal.raise_signal(signal.SIGTERM)

        model[1].register_forward_pre_hook(term)
        with pytest.raises(ExtractionError) as err:
            tl.extract(model, X, save=tl.func("relu"), to=tmp_path / "run", progress=False)
        assert err.value.code == "interrupted" and calls == [signal.SIGTERM]
        assert _store.done_batches(tmp_path / "run") == {0}
        assert signal.getsignal(signal.SIGTERM) is not None and calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


class Numbers(Dataset):
    """30 examples; from index ``fail_from`` on, loading fails (a run stopped midway)."""

    fail_from = 30

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= self.fail_from:
            raise OSError("the disk went away")
        return torch.full((4,), float(i))


def test_a_resumed_bar_starts_at_the_examples_on_disk(tmp_path, capsys, monkeypatch):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    loader = DataLoader(Numbers(), batch_size=6)
    run = tmp_path / "run"
    monkeypatch.setattr(Numbers, "fail_from", 12)
    with pytest.raises(OSError):
        tl.extract(model, loader, save=tl.func("relu"), to=run, progress=False)
    assert _store.done_batches(run) == {0, 1}
    monkeypatch.setattr(Numbers, "fail_from", 30)
    capsys.readouterr()
    ex = tl.extract(model, loader, save=tl.func("relu"), to=run, progress=True)
    assert ex.n_examples == 30
    bar = capsys.readouterr().err
    assert "tl.extract (12 on disk)" in bar and "30/30" in bar
    assert "| 12/30" in bar  # it starts at the 12 examples already done


def test_a_forked_worker_keeps_the_default_sigterm(tmp_path):
    import os

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    with _signals.guarded():
        pid = os.fork()
        if pid == 0:  # a DataLoader worker forked mid-run, whose loop catches everything
            try:
                signal.raise_signal(signal.SIGTERM)  # ends it by the signal, as by default
                os._exit(3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_gpt2_blocks_up_to_the_last_residual_add_are_named_by_address(tmp_path):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=100,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = [
        torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(k)) for k in (1, 2)
    ]
    trace = tl.trace(model, ids[0])
    last = [op.label for op in trace if tl.module("transformer.h.2").output.matches(op)]
    assert last == ["add_14"]  # the last block's residual add, which used to go missing
    ex = tl.extract(model, ids, save=tl.module(type=GPT2Block).output,
                    stop_after=tl.label(*last), to=tmp_path / "run", progress=False)  # fmt: skip
    names = [f"transformer.h.{i}" for i in range(3)]
    assert list(ex) == names
    assert ex.meta["site_ops"] == dict(zip(names, ["add_6", "add_10", "add_14"]))
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for name in names:
        block = model.get_submodule(name)
        block.register_forward_hook(
            lambda m, a, out, name=name: rows[name].append(
                out[0] if isinstance(out, tuple) else out
            )
        )
    with torch.no_grad():
        for x in ids:
            model(x)
    for name in names:
        torch.testing.assert_close(ex[name][:], torch.cat(rows[name]))


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h.relu(), h.sigmoid()  # two values from one call


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()

    def forward(self, x):
        a, b = self.pair(x)
        c, d = self.pair(a + b)
        return c * d


def test_each_value_a_call_returns_is_its_own_site(tmp_path):
    torch.manual_seed(0)
    model = Twice().eval()
    ex = tl.extract(model, X, save=tl.module("pair").output, to=tmp_path / "run", progress=False)
    assert list(ex) == ["pair:1[0]", "pair:1[1]", "pair:2[0]", "pair:2[1]"]
    with torch.no_grad():
        a, b = zip(*(model.pair(x) for x in X))
        torch.testing.assert_close(ex["pair:1[1]"][:], torch.cat(b))
        c, d = zip(*(model.pair(x + y) for x, y in zip(a, b)))
        torch.testing.assert_close(ex["pair:2[0]"][:], torch.cat(c))


def test_a_halt_on_the_forwards_last_op_still_puts_the_buffers_back():
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2)).train()  # updates its stats
    before = model[0].running_mean.clone()
    rec = tl.record(model, X[0], save=tl.module("1").output, stop_after=tl.label("linear_1"))
    assert rec.labels == ["linear_1"] and rec.halted and rec.output is None
    assert rec["linear_1"].returned_by == (("1", 1, "Linear"),)
    assert torch.equal(model[0].running_mean, before)  # as when a halt cuts the forward
