"""Backends from the user's own code reach the conformance command line: by import path or
by an entry point of the ``torchlens.backends`` group."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchlens.backends.registry import (
    backend_specs,
    get_backend_spec,
    load_backend,
    unregister_backend_spec,
)
from torchlens.errors import InvalidArgumentError, UnknownBackendError

BACKEND_FILE = textwrap.dedent(
    """
    import torchlens as tl
    from torchlens.backends import BackendSpec

    class MyBackend(tl.backends.TorchBackend):
        name, maturity = "mine", "experimental"

    def make():
        return MyBackend()

    SPEC = BackendSpec("mine_spec", "preview", MyBackend)
    """
)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "my_backend.py").write_text(BACKEND_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {spec.name for spec in backend_specs()}
    yield tmp_path
    for spec in backend_specs():
        if spec.name not in before:
            unregister_backend_spec(spec.name)
    sys.modules.pop("my_backend", None)


def test_an_import_path_registers_the_backend(user_dir):
    for reference in ("my_backend:MyBackend", "my_backend:make"):
        spec = load_backend(reference)
        assert (spec.name, spec.maturity) == ("mine", "experimental")
        assert get_backend_spec("mine") is spec
        assert load_backend("mine") is spec and load_backend(reference) is spec
        unregister_backend_spec("mine")
    assert load_backend("my_backend:SPEC").name == "mine_spec"
    assert load_backend("torchlens.backends.torch_backend:TorchBackend") is get_backend_spec(
        "torch"
    )


def test_an_entry_point_registers_the_backend(user_dir):
    info = user_dir / "my_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torchlens.backends]\nmine = my_backend:MyBackend\n")
    assert load_backend("mine").maturity == "experimental"


def test_bad_references_say_how_to_write_them(user_dir):
    with pytest.raises(InvalidArgumentError) as info:
        load_backend("no_such_module:Thing")
    assert info.value.code == "backend_import_failed" and "package.module:object" in str(info.value)
    with pytest.raises(InvalidArgumentError):
        load_backend("my_backend:Missing")
    with pytest.raises(UnknownBackendError) as info:
        load_backend("nope")
    assert "package.module:object" in str(info.value)


def test_the_command_line_checks_a_backend_from_the_users_module(user_dir):
    done = subprocess.run(
        [sys.executable, "-m", "torchlens.backends.conformance"]
        + ["--backend", "my_backend:MyBackend", "--case", "mlp"],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "mine     mlp" in done.stdout and "mine: conforms" in done.stdout
