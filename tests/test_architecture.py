"""The package's shape: layers import only downward, and the public surface changes on purpose."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torchlens as tl

PACKAGE = Path(tl.__file__).resolve().parent

# Lower numbers sit lower: a module may import (at module level) only from lower layers or
# from its own package. Lazy imports inside functions (Trace.draw -> viz) are the exception.
LAYERS = {
    "_version": 0, "_table": 0, "_tensors": 0, "errors": 0,
    "_calls": 0,  # the one rule for passing the op (or batch) to a user function
    "_gc": 0,  # the cyclic collector paused around allocation-heavy passes
    "_views": 0.5,  # read-only views the data model hands out (module calls, summaries)
    "_store": 0.5,  # where saved values live (PayloadStore), re-exported by trace
    "_source": 0.5,  # op.source: the model line behind an op (tl.trace(source=True))
    "_patterns": 0.25,  # module address globs, shared by selectors and the views
    "_escapes": 0.5,  # Escape and HiddenEdge records, re-exported by trace
    "layers": 0.5,  # layers and passes: a pass over a finished trace (trace.layers)
    "capabilities": 1, "trace": 1, "selectors": 1,
    "recording": 2,
    "_llm_sites": 2,  # TransformerLens's names as selectors
    "capture": 3,
    "replay": 4, "io": 4, "viz": 4,
    "attention": 4.5,  # reads recorded attention calls; edits builds on it
    "report": 5, "extract": 5, "edits": 5, "debug": 5,
    "distributed": 5,  # sharded models: collectives, DTensor layouts, per-rank files
    "backends": 6,
    "demo": 7, "cli": 7,
    "__main__": 8, "__init__": 9,
}  # fmt: skip


def _group(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _top_level_imports(path: Path) -> set[str]:
    groups = set()
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "torchlens":
                groups.add(parts[1] if len(parts) > 1 else "__init__")
    return groups


def test_every_module_has_a_layer():
    groups = {_group(path) for path in PACKAGE.rglob("*.py")}
    assert groups <= set(LAYERS), groups - set(LAYERS)


def test_layers_import_only_downward():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        group = _group(path)
        for imported in _top_level_imports(path) - {group}:
            if LAYERS[imported] >= LAYERS[group] and group != "__init__":
                upward.append(f"{path.relative_to(PACKAGE)} imports {imported}")
    assert upward == []


def test_public_names():
    assert sorted(tl.__all__) == [
        "Intervention", "ModuleCall", "Op", "Recording", "Selector", "Source", "Trace",
        "__version__", "attention_pattern", "backends", "diff", "distributed", "errors",
        "extract", "find_nonfinite", "func", "label", "layer", "llm_sites", "load",
        "load_extraction", "module", "record", "replay", "report", "save", "summary", "trace",
        "validate", "viz", "where",
    ]  # fmt: skip
    for name in tl.__all__:
        if name != "__version__":
            assert getattr(tl, name).__doc__, f"tl.{name} has no docstring"


def test_public_signatures():
    signatures = {
        name: str(inspect.signature(getattr(tl, name)))
        for name in ("trace", "validate", "replay", "record", "load", "save")
    }
    call = "model: 'Any', args: 'Any' = (), kwargs: 'Mapping[str, Any] | None' = None, *, "
    checks = "scope: 'str' = 'forward', atol: 'float | None' = None, rtol: 'float | None' = None"
    edits = "intervene: 'Mapping[Any, Any] | None' = None"
    seed = "random_seed: 'int | None' = None"
    assert signatures == {
        "trace": f"({call}structure_only: 'bool' = False, save: 'Any' = None, {edits}, "
        "stop_after: 'Any' = None, stream_to: 'str | os.PathLike | None' = None, "
        "save_grads: 'bool' = False, intermediate_derived_grads: 'bool' = False, "
        "source: 'bool' = False, root: 'Any' = None, validate: 'bool' = False) -> 'Trace'",
        "validate": f"({call}{checks}, {edits}, {seed}, accept_hidden_edges: 'bool' = False) "
        "-> 'bool'",
        "replay": f"({call}{checks}, {edits}, {seed}) -> 'ReplayStatus'",
        "record": f"({call}save: 'Any' = None, {edits}, stop_after: 'Any' = None, "
        "root: 'Any' = None) -> 'Recording'",
        "load": "(path: 'str | os.PathLike') -> 'Trace'",
        "save": "(trace: 'Trace', path: 'str | os.PathLike') -> 'Path'",
    }
