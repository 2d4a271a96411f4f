"""tl.extract across processes: a run killed midway and resumed, two torchrun ranks, and
runs stopped by SIGTERM (alone and under torchrun) or SIGKILL inside a forward.

They compare with one uninterrupted single-process run of the same model and data, or
with a plain forward-hook loop (``tests/_extract_worker.py``). The stopped runs are held
at a marker file, not timed with sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import torchlens as tl
from torchlens.errors import ExtractionError
from torchlens.extract import Extraction, _run, _store

WORKER = Path(__file__).resolve().parent / "_extract_worker.py"
sys.path.insert(0, str(WORKER.parent))
import _extract_worker as worker  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _assert_same(a: Extraction, b: Extraction) -> None:
    assert sorted(a) == sorted(b) == ["linear_1", "relu_1"]
    assert a.n_examples == b.n_examples == worker.N_EXAMPLES
    for site in a:
        assert a[site].shape == b[site].shape
        assert torch.equal(a[site][:], b[site][:]), site
    assert torch.equal(a.targets[:], b.targets[:])


def test_resume_after_kill_gives_identical_arrays(tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(WORKER), str(out), "--iterable", "--slow"],
                            env=ENV, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_store.done_batches(out) if (out / "shards").exists() else ()) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the worker wrote no shard in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = _store.done_batches(out)
    assert 3 <= len(done) < 9 and not (out / "manifest.json").exists()
    with pytest.raises(ExtractionError) as err:
        tl.load_extraction(out)
    assert err.value.code == "incomplete"
    before = {p.name: p.stat().st_ino for p in (out / "shards").glob("shard-*")}
    again = subprocess.run(proc.args, env=ENV, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]  # the same command, resumed
    after = {p.name: p.stat().st_ino for p in (out / "shards").glob("shard-*")}
    assert len(after) == 9 and before.items() <= after.items()  # kept, not redone
    _assert_same(tl.load_extraction(out), worker.run(str(tmp_path / "whole"), iterable=True))


def test_torchrun_two_processes_match_one_process(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(WORKER), str(tmp_path / "ranks"), "--both"]  # fmt: skip
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    single = worker.run(str(tmp_path / "single"))
    for split in ("loader", "iterable"):
        ranks = tl.load_extraction(tmp_path / "ranks" / split)
        assert ranks.meta["world_size"] == 2
        files = {s["file"] for s in ranks.meta["shards"]}
        assert len(files) == 2  # each rank wrote its own shard, rows interleaved by batch
        _assert_same(ranks, single)


def test_torchrun_ranks_that_disagree_or_fail_all_raise_typed(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(WORKER), str(tmp_path), "--ranks"]  # fmt: skip
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Process group cannot be None" not in done.stderr  # destroyed once, by the script
    files = [tmp_path / f"outcomes-rank{rank}.jsonl" for rank in (0, 1)]
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    cases = {(line["case"], line["rank"]): line for line in lines}
    for rank in (0, 1):  # every rank raises the same typed error, naming what differs
        own_dirs = cases["own_dirs", rank]
        assert (
            own_dirs["code"] == "ranks_differ"
            and "own_dirs/rank1' on ranks [1]" in (own_dirs["message"])
        )
        for case in ("own_order", "own_subset"):  # its own order, its own part of the data
            assert cases[case, rank]["code"] == "ranks_differ"
            assert "batches:" in cases[case, rank]["message"]
        split = cases["split_shapes", rank]
        assert split["code"] == "shape_changed"
        assert "(16, 8) (F32) in batches [1, 3]" in split["message"]
        assert "(12, 8) (F32) in batches [0, 2]" in split["message"]
        failed = cases["rank1_fails", rank]
        assert (
            failed["code"] == "bad_batch"
            and "rejected batch 1 (rows 2 to 3)" in (failed["message"])
        )
    assert cases["rank1_fails", 0]["message"].startswith("rank 1 stopped the run: ")
    assert _store.done_batches(tmp_path / "rank1_fails") == {0, 2}  # rank 0's batches kept
    assert not (tmp_path / "own_dirs" / "rank1").exists()
    # FSDP2: DTensor parameters are hashed whole, so both ranks agree with an unsharded copy
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU()).eval()
    for rank in (0, 1):
        rows, reference, digest = cases["fsdp2", rank]["value"]
        torch.testing.assert_close(torch.tensor(rows), torch.tensor(reference))
        assert digest == _run._digest(plain)
        assert cases["side_group", rank]["value"] == [6, True]


def _start(command: list[str], log: Path) -> subprocess.Popen:
    """Start ``command`` with its stderr to ``log`` (a pipe nobody reads could fill up)."""
    with open(log, "wb") as f:
        return subprocess.Popen(command, env=ENV, stderr=f)


def _wait_for(markers: list[Path], proc: subprocess.Popen, seconds: float = 120) -> None:
    """Wait until every marker file exists (the worker is held inside a forward)."""
    deadline = time.monotonic() + seconds
    log = markers[0].with_name("stderr.log")
    while not all(m.exists() for m in markers):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the worker never reached its hold"
        time.sleep(0.05)


def _resume(out: Path) -> None:
    """Run the worker's command again without the hold, then check every row."""
    again = subprocess.run([sys.executable, str(WORKER), str(out)], env=ENV,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_rows(tl.load_extraction(out))


def _assert_rows(ex: Extraction) -> None:
    """Every row of every site equals a plain forward-hook loop's."""
    expected = worker.reference()
    assert list(ex) == ["relu_1", "linear_1"] and ex.n_examples == worker.N_EXAMPLES
    for site in ex:
        torch.testing.assert_close(ex[site][:], expected[site], rtol=1e-6, atol=1e-6)
    assert torch.equal(ex.targets[:], expected["targets"])


def test_sigterm_midway_writes_the_rows_held_exits_by_the_signal_and_resumes(tmp_path):
    out = tmp_path / "run"  # 9 batches; held inside the forward of the 5th (batch 4)
    proc = _start([sys.executable, str(WORKER), str(out), "--hold", "5"], tmp_path / "stderr.log")
    try:
        _wait_for([Path(f"{out}.hold-rank0")], proc)
        assert _store.done_batches(out) == set()  # batches 0-3 are held in memory only
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGTERM  # ended by the signal, as without torchlens
    assert _store.done_batches(out) == {0, 1, 2, 3}  # what it held, written before it ended
    assert not (out / "manifest.json").exists() and not list(out.rglob(".tmp-*"))
    _resume(out)
    assert _store.done_batches(out) == set(range(9))


def test_sigkill_after_an_interval_flush_loses_only_the_rows_since(tmp_path):
    out = tmp_path / "run"  # the 3rd batch starts 0.6 s in: flush_s=0.2 writes 0-2 then
    command = [sys.executable, str(WORKER), str(out), "--hold", "5", "--flush", "0.2",
               "--pause", "3:0.6"]  # fmt: skip
    proc = _start(command, tmp_path / "stderr.log")
    try:
        _wait_for([Path(f"{out}.hold-rank0")], proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = _store.done_batches(out)  # batch 3 too if its forward alone took over 0.2 s
    assert {0, 1, 2} <= done <= {0, 1, 2, 3}, done
    _resume(out)


def test_sigterm_to_torchrun_every_rank_writes_what_it_held_then_resumes(tmp_path):
    out = tmp_path / "run"  # each rank is held in its 3rd batch: rank 0 in 4, rank 1 in 5
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc_per_node=2", str(WORKER), str(out)]  # fmt: skip
    proc = _start(launch + ["--hold", "3"], tmp_path / "stderr.log")
    try:
        _wait_for([Path(f"{out}.hold-rank{r}") for r in (0, 1)], proc)
        proc.send_signal(signal.SIGTERM)  # torchrun passes it on to each worker
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0
    assert _store.done_batches(out) == {0, 1, 2, 3}
    assert not (out / "manifest.json").exists()
    _resume(out)  # by one process: done batches are read whoever wrote them
