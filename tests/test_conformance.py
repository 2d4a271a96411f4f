"""The conformance suite: torch conforms, and a non-conforming backend is reported failing."""

from __future__ import annotations

import dataclasses
import runpy
import sys

import pytest
import torch

from torchlens.backends import BackendProtocol, BackendSpec, TorchBackend
from torchlens.backends.conformance import (
    CASES,
    CASES_BY_NAME,
    ORACLES,
    ConformanceCase,
    run_case,
    run_conformance,
)
from torchlens.backends.registry import register_backend_spec, unregister_backend_spec
from torchlens.trace import Trace


class MirrorBackend(TorchBackend):
    """Torch under another name: a second backend that conforms."""

    name = "mirror"
    maturity = "experimental"


class DroppingBackend(MirrorBackend):
    """Loses the last op of every capture (and the edges into it)."""

    name = "dropping"

    def capture(self, model, args, kwargs=None, **options) -> Trace:
        trace = super().capture(model, args, kwargs, **options)
        dropped = trace.ops[-2] if len(trace.ops) > 1 else trace.ops[-1]
        ops = [op for op in trace.ops if op is not dropped]
        for i, op in enumerate(ops):
            op.index = i
        return _rebuild(trace, ops=ops)


class PerturbingBackend(MirrorBackend):
    """Records the graph faithfully but reports an output that is off by 1e-2."""

    name = "perturbing"

    def capture(self, model, args, kwargs=None, **options) -> Trace:
        trace = super().capture(model, args, kwargs, **options)
        return _rebuild(trace, output=_nudge(trace.output))


def _nudge(output):
    if isinstance(output, torch.Tensor):
        return output + 1e-2 if output.is_floating_point() else output + 1
    if isinstance(output, dict):
        return {k: _nudge(v) for k, v in output.items()}
    if isinstance(output, (list, tuple)):
        return type(output)(_nudge(v) for v in output)
    return output


def _rebuild(trace: Trace, **changes) -> Trace:
    parts = dict(
        ops=trace.ops,
        sources=trace.sources,
        modules=trace.modules,
        input_labels=trace.input_labels,
        output_labels=trace.output_labels,
        output=trace.output,
        store=trace.store,
        rng_state=trace.rng_state,
        meta=trace.meta,
    )
    parts.update(changes)
    return Trace(**parts)


@pytest.fixture(scope="module")
def report():
    return run_conformance([TorchBackend(), DroppingBackend(), PerturbingBackend()])


def test_the_fakes_fill_the_protocol():
    for backend in (MirrorBackend(), DroppingBackend(), PerturbingBackend()):
        assert isinstance(backend, BackendProtocol)


def test_corpus_is_a_dozen_distinct_cases_with_inventories():
    assert len(CASES) >= 12
    assert len(CASES_BY_NAME) == len(CASES)
    for case in CASES:
        assert case.expected_ops and all(n > 0 for n in case.expected_ops.values()), case.name


def test_torch_passes_every_oracle_on_every_case(report):
    assert report.backends[0] == "torch"
    torch_outcomes = [o for o in report.outcomes if o.backend == "torch"]
    assert len(torch_outcomes) == len(CASES) * len(ORACLES)
    assert report.passed("torch"), "\n".join(map(str, report.failures("torch")))


def test_a_backend_equal_to_torch_conforms():
    names = ["mlp", "dropout_train", "split_multi_output", "kwargs_dict_output"]
    report = run_conformance(["torch", MirrorBackend()], [CASES_BY_NAME[n] for n in names])
    assert report.passed("mirror"), report.failures("mirror")
    assert {o.state for o in report.outcomes if o.backend == "mirror"} == {"passed"}
    assert "mirror: conforms" in str(report)


def test_dropping_an_op_fails_inventory_and_graph(report):
    assert not report.passed("dropping")
    for case in CASES:
        assert report.state("dropping", case.name, "inventory") == "failed", case.name
        assert report.state("dropping", case.name, "graph") == "failed", case.name
    detail = next(o.detail for o in report.failures("dropping") if o.oracle == "inventory")
    assert detail.startswith("missing ")


def test_perturbed_outputs_fail_the_output_check(report):
    assert not report.passed("perturbing")
    for case in CASES:
        assert report.state("perturbing", case.name, "output") == "failed", case.name
        assert report.state("perturbing", case.name, "inventory") == "passed", case.name


def test_report_table_names_every_backend_and_verdict(report):
    text = str(report)
    assert text.splitlines()[0].split() == ["backend", "case", *ORACLES]
    assert "torch: conforms" in text
    assert "dropping: FAILS" in text and "perturbing: FAILS" in text
    assert "dropping / mlp / inventory: missing" in text


def test_oracle_torch_fails_is_not_comparable_for_others():
    wrong = dataclasses.replace(CASES_BY_NAME["mlp"], name="mlp_wrong", expected_ops={"relu": 1})
    report = run_conformance([MirrorBackend(), PerturbingBackend()], [wrong])
    assert report.backends == ("torch", "mirror", "perturbing")
    assert report.state("torch", "mlp_wrong", "inventory") == "failed"
    assert report.state("mirror", "mlp_wrong", "inventory") == "not_comparable"
    assert report.state("mirror", "mlp_wrong", "output") == "passed"
    assert report.passed("mirror") and not report.passed("torch")
    assert report.state("perturbing", "mlp_wrong", "output") == "failed"


def test_a_backend_that_raises_fails_its_cases():
    class Broken(MirrorBackend):
        name = "broken"

        def capture(self, model, args, kwargs=None, **options):
            raise RuntimeError("no kernels today")

    report = run_conformance([Broken()], [CASES_BY_NAME["mlp"]])
    failures = report.failures("broken")
    assert {o.oracle for o in failures} == set(ORACLES)
    assert "no kernels today" in failures[0].detail


def test_registered_backends_run_by_name():
    register_backend_spec(BackendSpec("dropping", "experimental", DroppingBackend))
    try:
        report = run_conformance(["dropping"], [CASES_BY_NAME["views"]])
    finally:
        unregister_backend_spec("dropping")
    assert report.backends == ("torch", "dropping")
    assert report.passed("torch") and not report.passed("dropping")


def test_run_case_agrees_on_stochastic_cases_and_keeps_caller_rng():
    torch.manual_seed(11)
    before = torch.get_rng_state()
    run = run_case(TorchBackend(), CASES_BY_NAME["dropout_train"])
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(run.captured.output, run.reference)


def test_case_records_are_frozen():
    case = CASES[0]
    assert isinstance(case, ConformanceCase)
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.name = "other"


def _run_module(monkeypatch, *argv: str) -> int:
    """``python -m torchlens.backends.conformance ARGV`` in this process (no torch re-import)."""
    monkeypatch.setattr(sys, "argv", ["conformance", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("torchlens.backends.conformance", run_name="__main__")
    return done.value.code


def test_command_line_prints_the_table(monkeypatch, capsys):
    assert _run_module(monkeypatch, "--case", "mlp", "--case", "views") == 0
    out = capsys.readouterr().out
    assert "torch    mlp" in out and "torch    views" in out and "torch: conforms" in out


def test_command_line_unknown_backend_lists_known_ones(monkeypatch, capsys):
    assert _run_module(monkeypatch, "--backend", "nope") == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "'torch'" in err


def test_command_line_exits_nonzero_for_a_failing_backend(monkeypatch, capsys):
    register_backend_spec(BackendSpec("perturbing", "experimental", PerturbingBackend))
    try:
        assert _run_module(monkeypatch, "--backend", "perturbing", "--case", "mlp") == 1
    finally:
        unregister_backend_spec("perturbing")
    assert "perturbing: FAILS" in capsys.readouterr().out
