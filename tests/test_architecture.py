"""The package's shape: layers import only downward, and the public surface changes on purpose."""

from __future__ import annotations

import ast
import functools
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


# -- package lines (STYLE rule 15) ---------------------------------------------------------
# A package is a first-level subpackage of torchlens (torchlens.capture, torchlens.replay,
# ...); the top-level modules (trace.py, recording.py, _store.py, ...) are one shared
# package, "torchlens". Across package lines:
#   (a) no name starting with "_" is imported (or read off an imported module), and no module
#       starting with "_" inside another subpackage. The underscored top-level modules
#       (_tensors.py, _store.py, ...) are the library's shared internals: any package may
#       import their public names, never their underscored ones;
#   (b) a package's modules are reached through its public face: ``from torchlens.replay
#       import lint``, not ``from torchlens.replay.lint import lint``, and only names that
#       the package's ``__all__`` offers;
#   (c) no package reads or writes another package's private attribute (``op._store``,
#       ``trace._by_label``): a class's underscored attributes (set on self/cls, class body,
#       __slots__) belong to its package, and code elsewhere asks for a public property.
#       An underscored attribute a package attaches to an object it does not own (the
#       capture's marks on wrapped forwards) belongs to the packages that attach it, when no
#       class declares it. The same name in two packages is ambiguous: a package that
#       defines the name itself is not flagged for it. A name no package of torchlens
#       declares or attaches is torch's or Python's (``tensor._version``, ``module._buffers``,
#       ``torch._C``, ``sys._getframe``, a namedtuple's ``_fields``): not this rule's concern.
SHARED = "torchlens"

# Underscored names whose accesses are never another package's, with why: a torchlens
# class may define the same name (a protocol, or torch's own attribute on its subclasses).
FOREIGN_PRIVATE = {
    "_repr_html_": "IPython's rich display protocol, which Trace, Op and the reports implement",
    **dict.fromkeys(
        ("_version", "_base", "_cdata", "_modules", "_parameters", "_buffers",
         "_forward_hooks", "_forward_pre_hooks"),
        "torch's Tensor and nn.Module internals, which the capture reads on the model's "
        "tensors and modules",
    ),
}  # fmt: skip

# Crossings that remain on purpose, each saying why and until when; the test fails when one
# no longer occurs, so the list only shrinks.
KNOWN_CROSSINGS: dict[tuple[str, str], str] = {}  # (find_nonfinite's mode once overrode
# four private RecordMode hooks; they are RecordMode's public policy methods now)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Module:
    def __init__(self, root: Path, path: Path, subpackages: set[str]) -> None:
        self.shown = path.relative_to(root.parent).as_posix()
        parts = path.relative_to(root).parts
        self.package = parts[0] if len(parts) > 1 and parts[0] in subpackages else SHARED
        self.tree = ast.parse(path.read_text(), str(path))

    def where(self, node: ast.AST) -> str:
        return f"{self.shown}:{node.lineno}"


@functools.cache
def _modules(root: Path) -> tuple[set[str], list[_Module]]:
    subpackages = {p.parent.name for p in root.glob("*/__init__.py")}
    return subpackages, [_Module(root, p, subpackages) for p in sorted(root.rglob("*.py"))]


def _target(dotted: str, subpackages: set[str]) -> tuple[str, list[str]] | None:
    """The package a ``torchlens...`` module path lies in, and the parts below it."""
    parts = dotted.split(".")
    if parts[0] != "torchlens":
        return None
    if len(parts) > 1 and parts[1] in subpackages:
        return parts[1], parts[2:]
    return SHARED, []


def _exports(root: Path, package: str) -> set[str]:
    for node in ast.parse((root / package / "__init__.py").read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return set(ast.literal_eval(node.value))
    return set()


def import_crossings(root: Path) -> list[str]:
    """Rules (a) and (b) over the modules under ``root`` (a ``torchlens`` folder)."""
    subpackages, modules = _modules(root)
    faces = {package: _exports(root, package) for package in subpackages}
    found = []
    for mod in modules:
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imports = [(node.module, [alias.name for alias in node.names])]
            elif isinstance(node, ast.Import):
                imports = [(alias.name, []) for alias in node.names]
            else:
                continue
            for dotted, names in imports:
                target = _target(dotted, subpackages)
                if target is None or target[0] == mod.package:
                    continue
                package, inner = target
                if any(_is_private(part) for part in inner):
                    found.append(f"{mod.where(node)}: imports the private module {dotted}")
                for name in names:
                    if _is_private(name):
                        found.append(f"{mod.where(node)}: imports the private name {name} "
                                     f"from {dotted}")  # fmt: skip
                if package == SHARED:
                    continue
                if inner:
                    found.append(f"{mod.where(node)}: imports {', '.join(names) or dotted} "
                                 f"from {dotted}; import it from torchlens.{package}")  # fmt: skip
                else:
                    for name in names:
                        if not _is_private(name) and name not in faces[package]:
                            found.append(f"{mod.where(node)}: imports {name} from "
                                         f"torchlens.{package}, whose __all__ does not "
                                         "offer it")  # fmt: skip
        aliases = _module_aliases(mod, root, subpackages)
        for node in ast.walk(mod.tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _is_private(node.attr)
            ):
                found.append(f"{mod.where(node)}: reads the private name {node.attr} of "
                             f"{aliases[node.value.id]}")  # fmt: skip
    return found


def _module_aliases(mod: _Module, root: Path, subpackages: set[str]) -> dict[str, str]:
    """The names a module binds to modules of other packages (``from torchlens.capture
    import rng``, ``import torchlens.io._encode as enc``): ``{local name: module path}``."""
    aliases = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            bound = [(a.asname, a.name) for a in node.names if a.asname]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            bound = [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names]
        else:
            continue
        for name, dotted in bound:
            target = _target(dotted, subpackages)
            where = root.parent.joinpath(*dotted.split("."))
            is_module = where.with_suffix(".py").exists() or (where / "__init__.py").exists()
            if target is not None and target[0] != mod.package and is_module:
                aliases[name] = dotted
    return aliases


def _constant_name(node: ast.Call) -> str | None:
    """The attribute a ``getattr``/``setattr``/``hasattr``/``delattr`` call names."""
    if (
        isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def _class_names(cls: ast.ClassDef) -> set[str]:
    """The names a class declares: its body's names, slots and attributes set on self/cls."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    names.update(
                        c.value for c in ast.walk(node.value)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    )  # fmt: skip
                elif isinstance(target, ast.Name):
                    names.add(target.id)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {name for name in names if _is_private(name)}


def _accesses(tree: ast.AST):
    """Every ``x._name`` (read, written or deleted), getattr-style access and ``_name=``
    keyword, as ``(node, name, attached)``; ``attached`` when it sets the attribute on an
    object other than self/cls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            yield node, node.attr, isinstance(node.ctx, ast.Store) and not own
        elif isinstance(node, ast.Call):
            name = _constant_name(node)
            if name is not None and _is_private(name):
                yield node, name, node.func.id == "setattr"
            for keyword in node.keywords:
                if keyword.arg is not None and _is_private(keyword.arg):
                    yield node, keyword.arg, False


def _imported_names(mod: _Module, subpackages: set[str]) -> dict[str, tuple[str, str]]:
    """The names a module imports from torchlens: ``{local name: (package, name)}``."""
    imported = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            target = _target(node.module, subpackages)
            if target is not None:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (target[0], alias.name)
    return imported


def attribute_crossings(root: Path) -> list[tuple[tuple[str, str], str]]:
    """Rule (c) over the modules under ``root``, as ``((module, name), message)``: an
    attribute access, or a class that declares a private name of its base from another
    package (overriding its hook or setting its state)."""
    subpackages, modules = _modules(root)
    declared: dict[str, set[str]] = {}
    classes: dict[tuple[str, str], set[str]] = {}  # (package, class) -> its private names
    for mod in modules:
        names = declared.setdefault(mod.package, set())
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ClassDef):
                names.update(_class_names(node))
                classes.setdefault((mod.package, node.name), set()).update(_class_names(node))
    every = set().union(*declared.values())
    attached: dict[str, set[str]] = {}
    for mod in modules:
        for _, name, sets in _accesses(mod.tree):
            if sets and name not in every:
                attached.setdefault(mod.package, set()).add(name)
    owned = {
        package: declared.get(package, set()) | attached.get(package, set())
        for package in {*declared, *attached}
    }
    found = []
    for mod in modules:
        own = owned.get(mod.package, set())
        for node, name, _ in _accesses(mod.tree):
            if name in own or name in FOREIGN_PRIVATE:
                continue
            owners = sorted(package for package, names in owned.items() if name in names)
            if owners:
                found.append(((mod.shown, name), f"{mod.where(node)}: reaches {name}, "
                              f"a private attribute of {' and '.join(owners)}"))  # fmt: skip
        imported = _imported_names(mod, subpackages)
        for node in ast.walk(mod.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                origin = imported.get(base.id) if isinstance(base, ast.Name) else None
                if origin is None or origin[0] == mod.package:
                    continue
                package = origin[0]
                theirs = classes.get(origin, set())
                for name in sorted(_class_names(node) & theirs):
                    found.append(((mod.shown, name), f"{mod.where(node)}: {node.name} "
                                  f"declares {name}, a private name of its base {base.id} "
                                  f"in {package}"))  # fmt: skip
    return found


def test_packages_import_only_public_names():
    assert import_crossings(PACKAGE) == []


def test_packages_read_no_private_attribute_of_another():
    found = attribute_crossings(PACKAGE)
    unknown = [message for key, message in found if key not in KNOWN_CROSSINGS]
    assert unknown == []
    stale = set(KNOWN_CROSSINGS) - {key for key, _ in found}
    assert not stale, f"no longer crossing: remove {sorted(stale)} from KNOWN_CROSSINGS"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "torchlens"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


_LIBRARY = {
    "_shared.py": "def helper():\n    pass\n\n\ndef _secret():\n    pass\n",
    "capture/__init__.py": 'from torchlens.capture.inner import trace\n\n__all__ = ["trace"]\n',
    "capture/_private.py": "x = 1\n",
    "capture/inner.py": (
        "from torchlens.capture._private import x\n"  # inside one package: allowed
        "def trace():\n    pass\n\n\n"
        "def _hidden():\n    pass\n\n\n"
        "class Builder:\n    __slots__ = ('_state',)\n\n    def _hook(self):\n        pass\n"
    ),
    "edits/__init__.py": "__all__ = []\n",
}


def test_the_checker_reports_each_crossing_with_its_line(tmp_path):
    root = _tree(tmp_path, {**_LIBRARY, "edits/use.py": (
        "from torchlens._shared import helper\n"  # 1: a public name of a shared module
        "from torchlens._shared import _secret\n"  # 2: (a) a private name
        "from torchlens.capture import trace\n"  # 3: the public face
        "from torchlens.capture import Builder\n"  # 4: (b) not in capture's __all__
        "from torchlens.capture.inner import trace as t2\n"  # 5: (b) a capture module
        "from torchlens.capture._private import x\n"  # 6: (a) a private module, and (b)
        "from torchlens.capture.inner import Builder as B\n"  # 7: (b)
        "def f(b):\n"  # 8
        "    return b._state, getattr(b, '_state')\n"  # 9: (c) twice
        "class Mine(B):\n"  # 10: (c) overrides capture's hook
        "    def _hook(self):\n"
        "        self._mine = 1\n"
        "def g(o):\n"
        "    return o._mine, o.__dict__\n"  # 14: edits' own name, a dunder: allowed
        "from torchlens.capture import inner as capture_inner\n"  # 15: (b) not offered
        "capture_inner._hidden()\n"  # 16: (a) a private name of another package's module
    )})  # fmt: skip
    where = "torchlens/edits/use.py"
    assert import_crossings(root) == [
        f"{where}:2: imports the private name _secret from torchlens._shared",
        f"{where}:4: imports Builder from torchlens.capture, whose __all__ does not offer it",
        f"{where}:5: imports trace from torchlens.capture.inner; import it from torchlens.capture",
        f"{where}:6: imports the private module torchlens.capture._private",
        f"{where}:6: imports x from torchlens.capture._private; import it from torchlens.capture",
        f"{where}:7: imports Builder from torchlens.capture.inner; import it from "
        "torchlens.capture",
        f"{where}:15: imports inner from torchlens.capture, whose __all__ does not offer it",
        f"{where}:16: reads the private name _hidden of torchlens.capture.inner",
    ]
    assert sorted(message for _, message in attribute_crossings(root)) == [
        f"{where}:10: Mine declares _hook, a private name of its base B in capture",
        f"{where}:9: reaches _state, a private attribute of capture",
        f"{where}:9: reaches _state, a private attribute of capture",
    ]


def test_the_checker_passes_a_library_that_keeps_its_lines(tmp_path):
    root = _tree(tmp_path, {**_LIBRARY, "edits/use.py": (
        "from torchlens._shared import helper\n"
        "from torchlens.capture import trace\n"
        "class Own:\n    def __init__(self):\n        self._mine = 1\n"
        "def g(o):\n    o._marked = True\n    return o._mine, o._marked\n"
    )})  # fmt: skip
    assert import_crossings(root) == []
    assert attribute_crossings(root) == []


def test_an_attribute_one_package_attaches_is_its_own(tmp_path):
    """A mark the capture sets on an object it does not own (a wrapped forward) is the
    capture's: another package that reads it crosses the line."""
    root = _tree(tmp_path, {**_LIBRARY,
        "capture/marks.py": "def mark(f):\n    f._torchlens_seen = True\n",
        "edits/use.py": "def seen(f):\n    return getattr(f, '_torchlens_seen', False)\n",
    })  # fmt: skip
    assert [message for _, message in attribute_crossings(root)] == [
        "torchlens/edits/use.py:2: reaches _torchlens_seen, a private attribute of capture"
    ]
