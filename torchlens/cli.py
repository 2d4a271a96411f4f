"""The ``torchlens`` command line: ``demo``, ``doctor``, ``trace FILE.py:factory``, and
``show DIR`` / ``info DIR`` / ``diff DIR_A DIR_B`` for saved traces.

``trace`` imports the user's file, calls the factory for ``(model, args[, kwargs])``, traces,
validates by replay and prints the summary; ``--save`` and ``--draw`` keep the result. A bad
file or factory, or a directory that holds no trace, is a usage error: one clear line on
stderr and exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torchlens._version import __version__
from torchlens._views import filter_ops, summary_text
from torchlens.errors import TorchLensError

__all__ = ["main", "load_factory", "UsageError"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what `cat` or `seq` end with when `head` stops reading


class UsageError(Exception):
    """Bad command line input (file, factory, options): reported in one line, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        torchlens ...
        0
    """
    parser = _parser()
    try:
        opts = parser.parse_args(argv)
    except SystemExit as stop:  # argparse already printed the usage message
        return int(stop.code or 0)
    if opts.version:
        print(f"torchlens {__version__}")
        return EXIT_OK
    if opts.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code = opts.run(opts)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except (UsageError, _ModelError) as err:
        print(f"torchlens: error: {err}", file=sys.stderr)
        return EXIT_USAGE if isinstance(err, UsageError) else EXIT_FAILED
    except TorchLensError as err:
        if opts.traceback:
            raise
        print(f"torchlens: error [{err.code}]: {err}", file=sys.stderr)
        return EXIT_FAILED


def _closed_pipe() -> int:
    """The reader of stdout went away (``torchlens show DIR | head``): stop quietly.

    What is still buffered for stdout can go nowhere; pointing the descriptor at devnull
    lets the interpreter's final flush succeed instead of printing a traceback, the way
    Python's documentation recommends for SIGPIPE.
    """
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_CLOSED_PIPE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlens", description="Record, validate and draw eager PyTorch forward passes."
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.set_defaults(command=None, traceback=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="trace, validate and summarise a built-in model")
    demo.set_defaults(run=_run_demo)
    doctor = commands.add_parser("doctor", help="check this installation (torch, Graphviz, ...)")
    doctor.set_defaults(run=_run_doctor)
    trace = commands.add_parser(
        "trace",
        help="trace a model built by FILE.py:factory",
        description="Import FILE.py, call factory() for (model, args) or (model, args, kwargs), "
        "trace the forward, validate it by replay and print the summary.",
    )
    trace.add_argument("target", metavar="FILE.py:factory")
    trace.add_argument("--save", metavar="DIR", help="save the trace to directory DIR")
    trace.add_argument(
        "--force", action="store_true", help="with --save, replace a trace already in DIR"
    )
    trace.add_argument("--draw", metavar="FILE", help="draw the graph to FILE (.svg/.png/.pdf)")
    trace.add_argument("--depth", type=int, help="draw module calls at most N deep")
    trace.add_argument(
        "--collapse-repeats", action="store_true", help="draw identical repeated blocks once"
    )
    trace.add_argument(
        "--full-graph", action="store_true", help="draw every op, even for a big graph"
    )
    trace.add_argument("--no-validate", action="store_true", help="skip replay validation")
    trace.add_argument("--traceback", action="store_true", help="show full tracebacks")
    trace.set_defaults(run=_run_trace)
    show = commands.add_parser(
        "show", help="print the summary of a saved trace, or write its viewer page (--html)"
    )
    show.add_argument("dir", metavar="DIR", help="a directory written by tl.save or --save")
    show.add_argument("--func", action="append", help="only ops of this function (repeatable)")
    show.add_argument("--module", metavar="PATTERN", help="only ops inside these module calls")
    show.add_argument("--max-rows", type=int, default=40, help="rows before head/tail (40)")
    show.add_argument("--all", action="store_true", help="print every row")
    show.add_argument(
        "--html", metavar="FILE", help="write the interactive graph page to FILE (.html)"
    )
    show.add_argument("--open", action="store_true", help="with --html, open it in a browser")
    show.set_defaults(run=_run_show)
    info = commands.add_parser("info", help="print what a saved trace holds (model, versions)")
    info.add_argument("dir", metavar="DIR", help="a directory written by tl.save or --save")
    info.set_defaults(run=_run_info)
    diff = commands.add_parser(
        "diff",
        help="compare two saved traces op by op (exit 1 when they diverge)",
        description="Match the ops of two saved traces, compare their values under the replay "
        "tolerances and print the first divergent op and a per-op table (tl.diff).",
    )
    diff.add_argument("a", metavar="DIR_A", help="a directory written by tl.save or --save")
    diff.add_argument("b", metavar="DIR_B", help="the trace to compare with")
    diff.add_argument("--atol", type=float, help="absolute tolerance (default: per dtype)")
    diff.add_argument("--rtol", type=float, help="relative tolerance (default: per dtype)")
    diff.add_argument("--max-rows", type=int, default=40, help="rows before head/tail (40)")
    diff.add_argument("--all", action="store_true", help="print every row")
    diff.add_argument("--diverged", action="store_true", help="only rows that differ")
    diff.set_defaults(run=_run_diff)
    return parser


def _run_diff(opts: argparse.Namespace) -> int:
    from torchlens.debug import diff

    result = diff(_load_saved(opts.a), _load_saved(opts.b), atol=opts.atol, rtol=opts.rtol)
    print(result.headline())
    print(result.table(None if opts.all else opts.max_rows, only_diverged=opts.diverged))
    rows = len(result.diverged if opts.diverged else result.rows)
    if not opts.all and rows > opts.max_rows:
        narrow = "" if opts.diverged else ", --diverged only the rows that differ"
        print(f"({rows - opts.max_rows} rows not shown: --all prints every row{narrow})")
    return EXIT_OK if result.first_divergence is None and result.same else EXIT_FAILED


_SHOW_MORE_HINT = "--all prints every row, --func NAME or --module PATTERN narrows the table"


def _run_show(opts: argparse.Namespace) -> int:
    import torchlens as tl

    if opts.html and Path(opts.html).suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--html writes an .html page; got {opts.html!r}")
    trace = _load_saved(opts.dir)
    if opts.html:
        page = trace.show(opts.html, open=opts.open)
        print(f"viewer page: {page.path} ({page.path.stat().st_size // 1024} KB)")
        return EXIT_OK
    select = tl.func(*opts.func) if opts.func else None
    rows = None if opts.all else opts.max_rows
    ops, notes = filter_ops(trace.ops, select, opts.module)  # trace.summary, with CLI hints
    print(summary_text(trace, ops, rows, notes, more_hint=_SHOW_MORE_HINT))
    return EXIT_OK


def _run_info(opts: argparse.Namespace) -> int:
    from torchlens.report import trace_info

    _load_saved(opts.dir)  # a non-trace is a usage error, as for show
    print(trace_info(opts.dir))
    return EXIT_OK


def _load_saved(path: str) -> Any:
    """``tl.load(path)``; a path that holds no trace is a usage error (exit 2)."""
    import torchlens as tl
    from torchlens.errors import TraceFileError

    if not Path(path).is_dir():
        raise UsageError(f"no such directory: {path}")
    try:
        return tl.load(path)
    except TraceFileError as err:
        if err.code != "not_a_trace":
            raise
        raise UsageError(str(err)) from None


def _check_outputs(opts: argparse.Namespace) -> None:
    """Refuse ``--draw``/``--save`` targets up front, before the model runs."""
    from torchlens.viz import FORMATS

    if opts.draw and Path(opts.draw).suffix.removeprefix(".").lower() not in FORMATS:
        suffixes = ", ".join(f".{f}" for f in FORMATS)
        raise UsageError(f"--draw writes {suffixes} files; got {opts.draw!r}")
    if not opts.save:
        return
    target = Path(opts.save)
    if target.exists() and not target.is_dir():
        raise UsageError(f"--save needs a directory, but {opts.save} is a file")
    if target.is_dir() and any(target.iterdir()):
        if not (target / "manifest.json").exists() and not (target / "INCOMPLETE").exists():
            raise UsageError(f"--save {opts.save}: the directory holds other files; pick another")
        if not opts.force:
            raise UsageError(
                f"--save {opts.save}: a trace is already saved there; pass --force to "
                "replace it, or pick another directory"
            )


def _run_demo(opts: argparse.Namespace) -> int:
    from torchlens.demo import main as demo_main

    return int(demo_main() or 0)


def _run_doctor(opts: argparse.Namespace) -> int:
    from torchlens.report import doctor

    print(doctor())
    return EXIT_OK


def _run_trace(opts: argparse.Namespace) -> int:
    import torchlens as tl
    from torchlens.replay import attach_status, before_trace

    _check_outputs(opts)
    stages = ["import", "build", "trace"]
    stages += [] if opts.no_validate else ["validate"]
    stages += ["save"] if opts.save else []
    stages += ["draw"] if opts.draw else []
    with _progress(stages) as step, _user_code_dir(opts.target):
        step("import")
        factory = load_factory(opts.target)
        step("build")
        model, args, kwargs = _call_factory(factory, opts.target)
        step("trace")
        before = None if opts.no_validate else before_trace(model, args, kwargs)
        trace = _guard(lambda: tl.trace(model, args, kwargs), "tracing", opts.traceback)
        verdict, passed = "skipped (--no-validate)", True
        if before is not None:
            step("validate")  # from where the capture started; its proof joins the trace
            # tl.replay: the status behind tl.validate, with its counts; the status and the
            # hidden edges it found are kept on the trace (saved and drawn)
            status = _guard(
                lambda: attach_status(trace, before, None, tl.replay), "validating", opts.traceback
            )
            verdict, passed = str(status), status.state == "passed"
        if opts.save:
            step("save")
            trace.save(opts.save)
        if opts.draw:
            step("draw")
            trace.draw(
                opts.draw,
                depth="auto" if opts.depth is None else opts.depth,
                collapse_repeats=opts.collapse_repeats,
                **({"max_nodes": None} if opts.full_graph else {}),
            )
    print(trace.summary())
    print(f"validation: {verdict}")
    if opts.save:
        print(f"saved: {opts.save}")
    if opts.draw:
        print(f"drawn: {opts.draw}")
    return EXIT_OK if passed else EXIT_FAILED


def load_factory(target: str) -> Callable[[], Any]:
    """The function named by ``"path/to/file.py:factory"``, imported from that file.

    Raises:
        UsageError: the target is malformed, the file is missing or fails to import, or it
            has no callable of that name.
    """
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise UsageError(f"expected FILE.py:factory (e.g. model.py:build), got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    module_name = "_torchlens_user_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise UsageError(f"importing {path} failed: {_describe(err)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        known = [
            n
            for n, v in vars(module).items()
            if callable(v) and getattr(v, "__module__", None) == module_name
        ]
        hint = f"; callables there: {', '.join(sorted(known))}" if known else ""
        raise UsageError(f"{path} has no function {name!r}{hint}")
    return factory


def _call_factory(factory: Callable[[], Any], target: str) -> tuple[Any, Any, dict]:
    try:
        built = factory()
    except Exception as err:
        raise UsageError(f"{target}() failed: {_describe(err)}") from None
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise UsageError(
            f"{target}() must return (model, args) or (model, args, kwargs), "
            f"got {type(built).__name__}"
        )
    model, args, kwargs = (*built, None) if len(built) == 2 else built
    if kwargs is not None and not isinstance(kwargs, dict):
        raise UsageError(f"{target}(): kwargs must be a dict, got {type(kwargs).__name__}")
    return model, args, kwargs or {}


def _guard(run: Callable[[], Any], doing: str, show_traceback: bool) -> Any:
    """Run ``run``; an exception from the user's model becomes one line unless asked."""
    try:
        return run()
    except TorchLensError:
        raise
    except Exception as err:
        if show_traceback:
            raise
        message = f"the model raised {_describe(err)} while {doing} (rerun with --traceback)"
        raise _ModelError(message) from None


class _ModelError(Exception):
    """The user's model or factory code raised; reported in one line, exit code 1."""


def _describe(err: BaseException) -> str:
    notes = getattr(err, "__notes__", None)  # tl.trace notes the op a model's error hit
    where = f" ({notes[0].partition(':')[0]})" if notes else ""
    return f"{type(err).__name__}: {err}{where}"


@contextlib.contextmanager
def _user_code_dir(target: str) -> Iterator[None]:
    """Let the user's file import its neighbours, as ``python FILE.py`` would."""
    folder = str(Path(target.rpartition(":")[0] or ".").resolve().parent)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


@contextlib.contextmanager
def _progress(stages: list[str]) -> Iterator[Callable[[str], None]]:
    """A tqdm bar over the stages, on a terminal only (logs and pipes stay clean)."""
    from tqdm import tqdm

    bar = tqdm(total=len(stages), file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)

    def step(stage: str) -> None:
        if bar.n < stages.index(stage):
            bar.update(stages.index(stage) - bar.n)
        bar.set_description(stage)

    try:
        yield step
    finally:
        bar.update(len(stages) - bar.n)
        bar.close()
