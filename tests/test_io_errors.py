"""Damaged or hostile trace directories give typed errors with stable codes."""

from __future__ import annotations

import json

import pytest
import torch

import torchlens as tl
from torchlens.errors import TraceFileError


@pytest.fixture
def saved(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    return tl.save(tl.trace(model, torch.randn(2, 3)), tmp_path / "t")


def _code(path) -> str:
    with pytest.raises(TraceFileError) as err:
        trace = tl.load(path)
        for record in [*trace.sources, *trace.ops]:  # damage may only show when read
            record.out
    return err.value.code


def _edit_manifest(root, change) -> None:
    data = json.loads((root / "manifest.json").read_text())
    change(data)
    (root / "manifest.json").write_text(json.dumps(data))


def test_a_path_that_is_not_a_trace(tmp_path):
    assert _code(tmp_path / "missing") == "not_a_trace"
    assert _code(tmp_path) == "not_a_trace"  # empty directory
    (tmp_path / "file").write_text("hello")
    assert _code(tmp_path / "file") == "not_a_trace"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text('{"name": "some other tool"}')
    assert _code(tmp_path / "other") == "not_a_trace"


def test_missing_manifest(saved):
    (saved / "manifest.json").unlink()
    assert _code(saved) == "corrupt_manifest"


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_truncated_manifest(saved, cut):
    text = (saved / "manifest.json").read_bytes()
    (saved / "manifest.json").write_bytes(text[: int(len(text) * cut)])
    assert _code(saved) == "corrupt_manifest"


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["ops"][0].pop("parents"),
        lambda d: d["ops"][0].update(dtype="not_a_dtype"),
        lambda d: d["ops"][0].update(args_template={"$evil": "os.system"}),
        lambda d: d["ops"][0].update(args_template={"$dtype": "load"}),
        lambda d: d.update(payloads=[]),
        lambda d: d["payloads"]["relu_1"].pop("sha256"),
        lambda d: d.update(meta="NaN"),
    ],
    ids=[
        "missing_field",
        "bad_dtype",
        "unknown_tag",
        "dtype_not_a_dtype",
        "bad_table",
        "bad_entry",
        "bad_meta",
    ],
)
def test_corrupted_manifest(saved, change):
    _edit_manifest(saved, change)
    assert _code(saved) == "corrupt_manifest"


def test_garbage_manifest(saved):
    (saved / "manifest.json").write_bytes(b"\xff\xfe not json")
    assert _code(saved) == "corrupt_manifest"


def test_wrong_format_version(saved):
    _edit_manifest(saved, lambda d: d.update(format_version=99))
    assert _code(saved) == "format_version"


def test_missing_payload_file(saved):
    (saved / "payloads.safetensors").unlink()
    assert _code(saved) == "corrupt_payload"


def test_truncated_payload_file(saved):
    data = (saved / "payloads.safetensors").read_bytes()
    (saved / "payloads.safetensors").write_bytes(data[:-7])
    assert _code(saved) == "corrupt_payload"


def test_flipped_payload_bytes(saved):
    data = bytearray((saved / "payloads.safetensors").read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's data: only the checksum can tell
    (saved / "payloads.safetensors").write_bytes(bytes(data))
    assert _code(saved) == "corrupt_payload"


def test_truncated_rng_file(saved):
    (saved / "rng.safetensors").write_bytes(b"\x01")
    assert _code(saved) == "corrupt_payload"


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "a/../../x", ""])
def test_manifest_pointing_outside_its_directory(saved, target):
    _edit_manifest(saved, lambda d: d["payloads"]["relu_1"].update(file=target))
    assert _code(saved) == "unsafe_path"


def test_symlink_leading_outside(saved, tmp_path):
    (tmp_path / "elsewhere.safetensors").write_bytes((saved / "payloads.safetensors").read_bytes())
    (saved / "link.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    _edit_manifest(saved, lambda d: d["payloads"]["relu_1"].update(file="link.safetensors"))
    assert _code(saved) == "unsafe_path"


def test_hostile_function_is_not_resolved(saved):
    """A manifest naming torch.load or os.system loads without a function; nothing runs."""

    def swap(d):
        d["ops"][0]["func"] = {"name": "load", "ns": "torch"}
        d["ops"][1]["func"] = {"name": "system", "ns": "os"}

    _edit_manifest(saved, swap)
    trace = tl.load(saved)
    for op in trace.ops:
        assert op.func is None
        assert (
            "allow-list" in op.meta["replay_unavailable"]
            or "never" in op.meta["replay_unavailable"]
        )


def test_interrupted_save_is_incomplete(saved):
    (saved / "INCOMPLETE").write_text("")
    assert _code(saved) == "incomplete"
