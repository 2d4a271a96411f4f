"""Refreshes kept as their writes (``_store.WrittenOver``): a loop writing one slice of a
large tensor at a time keeps each step as "the previous step, with this write over it",
not as a copy of the whole tensor, and validation replays the chain by writing over one
value in place. Every value read back must be the value the tensor held at that moment."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.replay import check_trace, written_over


class RowByRow(nn.Module):
    """Writes one row of a buffer per step through a view, and reads the whole buffer
    after each write (each read is a refresh of the buffer)."""

    def forward(self, x):
        buf = torch.zeros(4, 8)
        sums = []
        for c in range(4):
            buf.select(0, c).copy_(x[c] * 2)
            sums.append(buf.sum(1))
        return torch.stack(sums)


@torch.jit.script
def _fill_row(buf: torch.Tensor, row: int):
    buf[row].fill_(7.0)  # inside TorchScript: a write the capture does not see


class HalfSeen(nn.Module):
    """One recorded write and one out of the capture's sight before the same read."""

    def forward(self, x):
        buf = torch.zeros(3, 4)
        buf.select(0, 0).copy_(x[0])
        _fill_row(buf, 1)
        s = buf.sum(1)
        buf.select(0, 2).copy_(x[2])
        return s + buf.sum(1)


def _rows_written(x: torch.Tensor, k: int) -> torch.Tensor:
    expected = torch.zeros(4, 8)
    expected[:k] = x[:k] * 2
    return expected


def test_each_step_of_a_loop_of_writes_is_kept_as_its_write_and_reads_back_exactly():
    x = torch.randn(4, 8)
    trace = tl.trace(RowByRow(), x)
    refreshes = [op.label for op in trace.ops if op.func_name == "refresh"]
    assert refreshes == ["refresh_1", "refresh_2", "refresh_3", "refresh_4"]
    # the first three were written over by the next step: kept as writes, not copied;
    # the last was never written over, so it is the tensor itself
    assert sorted(trace.store.written_over) == ["refresh_1", "refresh_2", "refresh_3"]
    recipe = trace.store.written_over["refresh_2"]
    assert recipe.stale == "refresh_1" and [w for w, _ in recipe.writes] == ["copy__2"]
    for k, label in enumerate(refreshes, start=1):
        torch.testing.assert_close(trace[label].out, _rows_written(x, k), rtol=0, atol=0)
    assert not trace.store.written_over  # made on their first read, and kept


def test_a_chain_kept_as_writes_validates_and_its_values_survive_the_replay():
    x = torch.randn(4, 8)
    status = tl.replay(RowByRow(), (x,))
    assert status.state == "passed", status
    assert status.replayed == status.ops == 26

    trace = tl.trace(RowByRow(), x)
    assert check_trace(trace).state == "passed"
    # the replay wrote over its own copy of each step in place, never the store's
    for k in range(1, 5):
        torch.testing.assert_close(trace[f"refresh_{k}"].out, _rows_written(x, k), rtol=0, atol=0)


def test_values_made_before_the_check_are_replayed_and_compared_as_any_other():
    x = torch.randn(4, 8)
    trace = tl.trace(RowByRow(), x)
    made = {label: trace[label].out for label in list(trace.store.written_over)}
    assert not trace.store.written_over  # read, so made and kept as ordinary values
    status = check_trace(trace)
    assert status.state == "passed" and status.replayed == status.ops
    bad = made["refresh_2"] + 1  # a made value the record no longer gives: caught
    trace.store.set("refresh_2", bad, bad._version)
    assert "refresh_2" in {f.label for f in check_trace(trace).failures}


def test_the_replay_writes_over_the_previous_step_in_place(monkeypatch):
    """The second and third steps stand on the step before, made by the replay: written
    over it, not copied (the first stands on a saved value, the fourth is saved itself)."""
    calls = []
    real = written_over._write_over

    def spy(value, writes, base):
        done = real(value, writes, base)
        calls.append(done)
        return done

    monkeypatch.setattr(written_over, "_write_over", spy)
    trace = tl.trace(RowByRow(), torch.randn(4, 8))
    assert check_trace(trace).state == "passed"
    assert calls == [True, True]


def test_a_write_out_of_sight_keeps_the_real_value_not_the_writes_redone():
    x = torch.randn(3, 4)
    trace = tl.trace(HalfSeen(), x)
    assert trace["refresh_1"].parents == ("zeros_1", "copy__1")
    # the version counter moved twice for one recorded write: the value is not the
    # writes over the stale value, so it is kept as it was, TorchScript's row included
    assert not trace.store.written_over
    value = trace["refresh_1"].out
    torch.testing.assert_close(value[0], x[0], rtol=0, atol=0)
    assert value[1].tolist() == [7.0] * 4 and value[2].tolist() == [0.0] * 4
    assert tl.replay(HalfSeen(), (x,)).state != "passed"


def test_a_record_edited_after_capture_is_replayed_not_taken_from_the_recipe():
    """A refresh whose record no longer matches how its value was made is replayed from
    the record: an injected bug (a lost write, a wrong region) fails or goes unverified."""
    x = torch.randn(4, 8)
    trace = tl.trace(RowByRow(), x)
    op = trace["copy__2"]
    shape, stride, offset = op.meta["geometry"]
    op.meta["geometry"] = (shape, stride, offset + 8)  # the write lands on the next row
    status = check_trace(trace)
    assert status.state == "failed"
    assert "refresh_2" in {f.label for f in status.failures}

    trace = tl.trace(RowByRow(), x)
    refresh = trace["refresh_3"]
    refresh.parent_args = refresh.parent_args[:1]  # its write lost
    refresh.parents = refresh.parents[:1]
    assert check_trace(trace).state != "passed"


def test_a_corrupted_write_is_caught_where_it_was_made():
    x = torch.randn(4, 8)
    trace = tl.trace(RowByRow(), x)
    trace.store.values["copy__2"] = trace.store.values["copy__2"] + 1.0
    status = check_trace(trace)
    assert status.state == "failed"
    assert "copy__2" in {f.label for f in status.failures}


def test_values_kept_as_writes_are_saved_and_loaded_as_values(tmp_path):
    x = torch.randn(4, 8)
    trace = tl.trace(RowByRow(), x)
    tl.save(trace, tmp_path / "rows")
    loaded = tl.load(tmp_path / "rows")
    for k in range(1, 5):
        torch.testing.assert_close(loaded[f"refresh_{k}"].out, _rows_written(x, k), rtol=0, atol=0)


def test_a_missing_stale_value_names_itself_and_the_refresh_made_from_it():
    trace = tl.trace(RowByRow(), torch.randn(4, 8))
    trace.store.mark_missing("refresh_1", "not_saved", "dropped for the test")
    with pytest.raises(tl.errors.PayloadUnavailableError) as caught:
        trace["refresh_2"].out
    assert caught.value.code == "not_saved"
    assert "refresh_2" in str(caught.value) and "dropped for the test" in str(caught.value)


def test_a_long_chain_is_made_without_recursion():
    class ManySteps(nn.Module):
        def forward(self, x):
            buf = torch.zeros(3000, 2)
            total = x.sum() * 0
            for c in range(3000):
                buf.select(0, c).fill_(float(c))
                total = total + buf[c].sum()  # a read of buf after each write
            return total + buf.sum()

    trace = tl.trace(ManySteps(), torch.randn(2))
    assert len(trace.store.written_over) == 2999  # each step kept as the one before + a write
    last = [op.label for op in trace.ops if op.func_name == "refresh"][-1]
    value = trace[last].out
    assert value[:, 0].tolist() == [float(c) for c in range(3000)]


def test_write_over_refuses_a_value_laid_out_otherwise():
    value = torch.zeros(2, 3)
    write = (torch.ones(3), ((3,), (1,), 3))
    assert written_over._write_over(value, [write], ((2, 3), (3, 1), 0))
    assert value.tolist() == [[0.0] * 3, [1.0] * 3]
    # a region outside the value, or a value not laid out as the base: nothing written
    outside = (torch.ones(3), ((3,), (1,), 6))
    assert not written_over._write_over(value, [outside], ((2, 3), (3, 1), 0))
    assert not written_over._write_over(value.t(), [write], ((2, 3), (3, 1), 0))
    assert value.tolist() == [[0.0] * 3, [1.0] * 3]


def test_a_value_with_a_view_alive_is_not_alone():
    value = torch.zeros(4)
    assert written_over._alone(value)
    view = value[1:]
    assert not written_over._alone(value)
    del view
    held = [value]
    assert not written_over._alone(value)
    assert held
