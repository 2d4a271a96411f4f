"""``benchmarks/device_check.sh``, the prepared run of issue 14's GPU rows, and the
benchmarks' ``--device cuda``: where torch sees no GPU (CI, this machine) each must stop at
once with its own message, and write nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

try:
    from tests._benchmarks import load_benchmark
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _benchmarks import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.sh"


def test_device_check_is_valid_bash():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs its checks")
def test_device_check_refuses_without_a_gpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2
    assert "sees no CUDA GPU" in done.stderr
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the benchmarks run")
@pytest.mark.parametrize("name", ["bench_capture", "bench_validate"])
def test_benchmarks_refuse_cuda_without_a_gpu(name, capsys):
    bench = load_benchmark(name)
    with pytest.raises(SystemExit) as exited:
        bench.main(["--device", "cuda"])
    assert exited.value.code == 2
    assert "--device cuda needs a CUDA build of torch and a GPU" in capsys.readouterr().err
