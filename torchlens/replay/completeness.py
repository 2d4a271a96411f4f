"""Arm 5, completeness: do the escapes hide dependencies the graph does not have?

A value read by Python (``.item()``, ``.tolist()``, ``.numpy()``, ``bool(t)``: a
:class:`~torchlens.trace.Escape`) can come back as a constant of a later op, which then
has no edge to the op whose value left. This arm reruns the model with the escaped Python
values perturbed (``replay/escape_values.py``) and watches what moves:

1. one plain forward with every escape perturbed; when it returns what the capture
   returned, and every value it computed from the first escape on has the fingerprint of
   the capture's (a float64 sum and magnitude sum per output: an intermediate no output
   reads can hold a dependency too), no dependency hides behind an escape (the usual case: a
   ``if mask.all():`` fast path, an ``assert not x.isnan().any()``). Cost: one forward,
   or less: it stops where it leaves the unperturbed rerun's path (a
   :class:`~torchlens.replay.escape_values.Diverged`), which is a branch decision (3).
2. when the outputs moved, one captured forward with the same values: an op that moved
   while none of its recorded parents did reads an escaped value. It gets a
   :class:`~torchlens.trace.HiddenEdge` from the escaped record, unless the graph has a
   path from that record already. With several escapes perturbed, one captured forward
   per escape, each alone, says which escape feeds which op (and finds the ones an
   earlier moved op hid). A hidden edge fails the arm.
3. an escape whose perturbed value changes which ops run (other functions, parents, or
   the forward raising, as an ``assert`` does) is a *branch decision*: the recorded graph
   is the graph of the branch taken, which is not a failure. It is noted with its line,
   held at its recorded value, and the rest are checked again (at most four forwards).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import torch

from torchlens.capture import flatten, rng, trace_for_check
from torchlens.errors import PayloadUnavailableError
from torchlens.replay.escape_values import (
    Budget,
    Diverged,
    OverBudget,
    PerturbingMode,
    Plan,
    recorded_calls,
    recorded_groups,
    saved_fingerprint,
)
from torchlens.replay.exemptions import MAY_BE_UNINITIALIZED
from torchlens.replay.findings import Findings
from torchlens.replay.ground_truth import ModelState, copy_inputs, expected_outputs
from torchlens.replay.param_guard import ParamGuard
from torchlens.replay.tolerances import differs, tolerance
from torchlens.trace import Escape, HiddenEdge, Trace

__all__ = [
    "check_completeness", "look_first", "FirstLook", "MAX_ROUNDS", "MAX_ATTRIBUTION_RUNS",
    "MAX_GROUP_RUNS",
]  # fmt: skip

MAX_ROUNDS = 6  # rounds (one or two forwards each) spent telling branch decisions apart
MAX_ATTRIBUTION_RUNS = 6  # up to this many escapes, one captured forward each tells them apart
MAX_GROUP_RUNS = 48  # past it, group testing: at most this many captured forwards
ARM = "completeness"
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # subclasses keep their own comparisons


@dataclass
class FirstLook:
    """The arm's first plain forward (every escape perturbed), run by :func:`look_first`
    before the capture: the tensors it returned (detached, flattened) or what it raised,
    and the mode that ran it."""

    output: list[torch.Tensor] | None
    mode: PerturbingMode
    error: BaseException | None
    down: tuple[list[torch.Tensor] | None, PerturbingMode, BaseException | None] | None = None


def look_first(
    model: Any,
    inputs: tuple[tuple, dict],
    rngs: tuple[Any, Any],
    state: ModelState,
    expected: PerturbingMode | None = None,
    budget: Budget | None = None,
    reference: Any = None,
    tolerances: tuple[float | None, float | None] = (None, None),
) -> FirstLook:
    """Run the arm's first forward now, with every escape perturbed, from ``inputs`` (a
    pristine copy), the RNG states ``rngs`` (torch's; Python's and NumPy's) and the model
    state ``state`` rewinds to (it is rewound after, and Python's RNGs put back). With
    ``expected`` (the ground-truth rerun's mode), it stops where it leaves that path;
    with ``budget``, where it runs past it.

    With ``reference`` (the ground-truth rerun's output) and that forward returning the
    same (within ``tolerances``, atol and rtol) on the same path, the arm will probe the
    numbers the other way too (see :meth:`_Arm.run`): that forward, every escape moved
    the other way, is run now as well (``down``), where it costs a plain forward.

    Validation calls it right after the ground-truth rerun, when that rerun made escapes:
    on a heap not yet holding the capture's values it costs what a plain forward costs,
    where after the capture and the replay arms it costs about half as much again (their
    values have pushed the model's out of the caches)."""
    try:
        args, kwargs = copy_inputs(*inputs)
        plan = Plan(None).start(budget, captured=False)
        first = FirstLook(*_light_forward(model, args, kwargs, rngs[0], plan, expected, state))
        # (a model whose escapes are all bools, most, pays nothing here: asked first)
        downs = plan.downs & first.mode.reentered  # (fine floats only Python read: not probed)
        if downs and reference is not None and _settled(first, reference, tolerances):
            rng.restore(rngs[1])
            state.rewind()
            args, kwargs = copy_inputs(*inputs)
            down = Plan(None, -1).start(budget, captured=False)
            first.down = _light_forward(model, args, kwargs, rngs[0], down, expected, state)
        return first
    finally:
        rng.restore(rngs[1])
        state.rewind()


def _settled(first: FirstLook, reference: Any, tolerances: tuple) -> bool:
    """Whether the first look ran the unperturbed path to its end and returned what the
    ground-truth rerun did: the round it stands for most likely settles every escape,
    and the numbers will be probed the other way."""
    if first.output is None or first.error is not None or first.mode.diverged is not None:
        return False
    want = [t for _, t in flatten(reference)[0]]
    if len(want) != len(first.output):
        return False
    return not any(_moved(got, exp, *tolerances) for got, exp in zip(first.output, want))


def _light_forward(
    model: Any, args: tuple, kwargs: dict, start: Any, plan: Plan,
    expected: PerturbingMode | None, state: ModelState, fingerprints: bool = True,
) -> tuple[list[torch.Tensor] | None, PerturbingMode, BaseException | None]:  # fmt: skip
    """A plain forward under a :class:`PerturbingMode` with ``plan`` (stopping where it
    leaves ``expected``'s path): (the tensors it returned, detached so their graph is
    freed, or None when it stopped; the mode; the error it raised). A parameter the
    forward writes (a perturbed flag re-running a first-call initialisation) is copied
    first into ``state``, whose next rewind puts it back."""
    mode = PerturbingMode(plan, expected, fingerprints=fingerprints)
    mode.guard = ParamGuard(state)
    try:
        with rng.restored(start), mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the ground-truth run showed the model's own)
            output = model(*args, **kwargs)
    except Diverged:
        return None, mode, None
    except OverBudget as err:  # a perturbed value made the run longer (a loop)
        return None, mode, err
    except Exception as err:  # the model's own error: a guard tripped
        return None, mode, None if mode.diverged else err
    if mode.diverged:  # (the model caught Diverged, and went on)
        return None, mode, None
    return [t.detach() for _, t in flatten(output)[0]], mode, None


class _Runner:
    """Runs the model from the state the capture started from, with a plan's values. The
    state the capture left is taken before its first run and put back by :meth:`close`."""

    def __init__(self, model: Any, inputs: tuple, start: Any, host: Any,
                 state: ModelState, intervene: Any,
                 expected: PerturbingMode | None = None,
                 budget: Budget | None = None) -> None:  # fmt: skip
        self.model, self.inputs, self.expected, self.budget = model, inputs, expected, budget
        self.start, self.host, self.state, self.intervene = start, host, state, intervene
        self.forwards = 0
        self._left: tuple[ModelState, Any] | None = None  # the capture's state, its RNGs

    def _fresh(self) -> tuple[tuple, dict]:
        if self._left is None:
            self._left = (ModelState(self.model), rng.host_snapshot())
        self.state.rewind()
        rng.restore(self.host)
        self.forwards += 1
        return copy_inputs(*self.inputs)

    def close(self) -> None:
        """Leave the model (and Python's RNGs) as the capture left them."""
        if self._left is not None:
            self._left[0].rewind()
            rng.restore(self._left[1])

    def light(
        self, plan: Plan, fingerprints: bool = True
    ) -> tuple[list | None, PerturbingMode, BaseException | None]:
        """A plain forward: (its output tensors, the mode that ran it, the error it raised)."""
        args, kwargs = self._fresh()
        plan.start(self.budget, captured=False)
        return _light_forward(
            self.model, args, kwargs, self.start, plan, self.expected, self.state, fingerprints
        )

    def captured(self, plan: Plan) -> tuple[Trace | None, BaseException | None]:
        args, kwargs = self._fresh()
        plan.start(self.budget, captured=True)
        try:
            with rng.restored(self.start), warnings.catch_warnings(), ParamGuard(self.state):
                warnings.simplefilter("ignore")  # (the ground-truth run showed the model's own)
                return trace_for_check(
                    self.model, args, kwargs, intervene=self.intervene, escape_hook=plan
                ), None  # fmt: skip
        except (Exception, OverBudget) as err:
            return getattr(err, "partial_trace", None), err


def check_completeness(
    model: Any,
    trace: Trace,
    inputs: tuple[tuple, dict],
    rngs: tuple[Any, Any],
    state: ModelState,
    findings: Findings,
    atol: float | None,
    rtol: float | None,
    intervene: Any = None,
    first: FirstLook | None = None,
    expected: PerturbingMode | None = None,
    budget: Budget | None = None,
) -> tuple[list[HiddenEdge], list[str], int]:
    """Run the arm (see the module docstring) on ``trace``, captured from ``inputs`` (a
    pristine copy), the RNG states ``rngs`` (torch's, Python's and NumPy's) and the model
    state ``state`` holds; the model is left as the capture left it. ``first`` is the
    first forward, when :func:`look_first` ran it already; ``expected``, the mode of the
    unperturbed rerun, whose path the plain forwards stop at leaving; ``budget``, what each
    forward may spend (past it, the forward stops and the escape is a decision).

    Hidden edges are failures in ``findings`` and are added to ``trace.hidden_edges``.

    Returns:
        The hidden edges, the branch decisions (as text), and the forwards it ran here.
    """
    runner = _Runner(model, inputs, rngs[0], rngs[1], state, intervene, expected, budget)
    try:
        edges, decisions = _Arm(runner, trace, findings, atol, rtol, first).run()
    finally:
        runner.close()
    trace.hidden_edges.extend(edges)
    findings.hidden_edges += edges
    findings.decisions += decisions
    return edges, decisions, runner.forwards


class _Arm:
    def __init__(self, runner: _Runner, trace: Trace, findings: Findings, atol, rtol,
                 first: FirstLook | None = None) -> None:  # fmt: skip
        self.runner, self.trace, self.findings, self.first = runner, trace, findings, first
        self.first_down = None if first is None else first.down  # see _light_down
        self.atol, self.rtol = atol, rtol
        self.calls: dict[int, list[Escape]] = {}
        for escape in trace.escapes:
            self.calls.setdefault(escape.call, []).append(escape)
        self.vias = [records[0].via for records in self.calls.values()]
        self.decisions: list[str] = []
        self.edges: list[HiddenEdge] = []
        self._saved_prints: dict[int, list[tuple | None]] = {}  # see _capture_prints
        self._drifting: set[str] | None = None  # see _without_drift, made on first need
        self.direction = 1  # which way the escaped values move (see run)
        self._drift_known: bool | None = None  # see _drifts
        # the escapes whose moved numbers came back into a torch call (see run); None
        # when not watched (edited forwards run captured only)
        self.taken: set[int] | None = set() if runner.intervene is None else None

    def run(self) -> tuple[list[HiddenEdge], list[str]]:
        """Rounds with the escaped values moved one way, then, for the numbers that can
        move the other way (a float down, an int up), once more that way: a threshold
        equal to an escaped value (``x > x.min().item()``) is crossed by one of the two."""
        pending = self._rounds(set(self.calls))
        self.direction = -1
        found = {edge.parent for edge in self.edges}  # (those with edges found are done)
        pending = {
            c for c in pending
            if _two_way(self.calls[c][0]) and self.calls[c][0].label not in found
            and (self.taken is None or c in self.taken)
        }  # fmt: skip
        if pending:
            self._rounds(pending)
        return self._direct(), self.decisions

    def _rounds(self, pending: set[int]) -> set[int]:
        """Rounds until every escape of ``pending`` is settled or held as a branch
        decision; returns those settled (perturbed without deciding a branch)."""
        for _ in range(MAX_ROUNDS):
            blame = self._round(Plan(pending, self.direction)) if pending else None
            if blame is None:
                return pending
            # the same code read again (a loop's test, per-image sizes) decides alike:
            # every read at the blamed escape's line is held with it
            decided = self.calls[blame][0]
            pending -= {c for c in pending if _same_site(self.calls[c][0], decided)}
            pending.discard(blame)
            # after a branch changed, bools are held too: each would mostly decide another
            # branch (a forward each); they were perturbed with the first round's values
            held = sorted(c for c in pending if self.calls[c][0].control)
            if held:
                pending -= set(held)
                self.decisions.append(
                    f"{len(held)} more bool escape(s), from {self.calls[held[0]][0]} on, "
                    "were perturbed only together with the branch decision above"
                )
        if not pending:
            return pending
        first = self.calls[min(pending)][0]
        self.findings.unchecked(
            first.label, ARM,
            f"{len(pending)} escape(s) from {first} on were not checked for hidden "
            f"dependencies: {MAX_ROUNDS} rounds went to telling branch decisions apart",
        )  # fmt: skip
        return set()

    def _round(self, plan: Plan) -> int | None:
        """One round with ``plan``: None when it settled every escape it perturbed, else
        the escape call that decided a branch (to hold at its value next round)."""
        if self.runner.intervene is None:
            output, mode, err = self._light(plan)
            vias = mode.vias
            if mode.diverged is not None:  # it stopped where it left the unperturbed path
                return self._left_path(plan, mode)
            if err is not None:
                return self._decided(self._last_before(plan, len(vias)), _what(err))
            k = _divergence(vias, self.vias)
            if not self._outputs_moved(output):
                if k is not None:
                    blame = self._escape_moved(plan, mode, k)
                    self._decided(blame, "changed which ops ran; the outputs stayed the same")
                    return None
                if not self._inside_moved(mode) or self._drifts():
                    return None  # nothing moved, out or inside: no dependency to look for
            elif k is not None:  # Python took another path: no capture needed to know that
                return self._decided(self._escape_moved(plan, mode, k), "changed which ops ran")
            else:
                j = _divergence(mode.calls, recorded_calls(self.trace))
                blame = None if j is None else self._bool_before(plan, mode, j)
                if blame is not None:
                    # other ops ran after a bool flipped: a branch (a capture would say so)
                    return self._decided(
                        blame,
                        f"changed which ops ran (a {mode.calls[j : j + 1] or 'missing'} call)",
                    )
        moved, err = self.runner.captured(plan)
        if moved is None or err is not None:
            seen = len({e.call for e in moved.escapes}) if moved is not None else 0
            seen = err.call if isinstance(err, OverBudget) else seen
            return self._decided(self._last_before(plan, seen), _what(err))
        d = _structure_divergence(self.trace, moved)
        targets = self._without_drift(self._targets(moved, d))
        if d is None:
            self._attribute(plan, targets)
            return None
        # what moved before the branch changed belongs to the branch when a bool decided
        # it (an arange sized by the branch taken); data escapes still get their edges
        self._attribute(plan, targets, data_only=True)
        index = self.trace.ops[d].index if d < len(self.trace.ops) else len(self.trace.ops)
        calls = [c for c in sorted(plan.moved) if self.calls[c][0].index <= index]
        blame = self._prefer_control(calls) if calls else self._last_before(plan, 0)
        label = self.trace.ops[d].label if d < len(self.trace.ops) else "the end"
        return self._decided(blame, f"changed which ops ran from {label} on")

    def _left_path(self, plan: Plan, mode: PerturbingMode) -> int | None:
        """The decision of a light forward that stopped at ``mode.diverged``: an escape
        call the unperturbed forward did not make there, or another op after a bool was
        flipped (both mean the perturbed values changed which ops run)."""
        kind, k = mode.diverged
        if kind == "escape":
            return self._decided(self._escape_moved(plan, mode, k), "changed which ops ran")
        blame = self._bool_before(plan, mode, k)
        return self._decided(
            self._last_before(plan, len(mode.vias)) if blame is None else blame,
            f"changed which ops ran (a {mode.calls[k]} call)",
        )

    def _escape_moved(self, plan: Plan, mode: PerturbingMode, k: int) -> int | None:
        """The escape that decided a light forward's escape calls parting from the
        unperturbed one's at ``k``: the last moved before the first other op, when other
        ops ran before (see :meth:`_before_other_ops`), else the last moved before ``k``."""
        blame = self._before_other_ops(plan, mode, k)
        return self._last_before(plan, k) if blame is None else blame

    def _before_other_ops(self, plan: Plan, mode: PerturbingMode, k: int) -> int | None:
        """When other ops ran before the forward met escape call ``k`` out of place, the
        last escape ``plan`` moved before the first of them: what decided the branch (a
        flag read with ``.item()`` that re-runs an initialisation, whose own escapes then
        come where the unperturbed forward made others of the same kind)."""
        expected = self.runner.expected
        j = None if expected is None else _divergence(mode.calls, expected.calls)
        if j is None:
            return None
        calls = [c for c in sorted(plan.moved) if c < min(k, len(mode.at)) and mode.at[c] <= j]
        return self._prefer_control(calls) if calls else None

    def _bool_before(self, plan: Plan, mode: PerturbingMode, j: int) -> int | None:
        """The last bool escape ``plan`` flipped in ``mode``'s forward before its call
        ``j``: what decided that other ops ran from there."""
        bools = [
            c for c in sorted(plan.moved)
            if self.calls[c][0].control and c < len(mode.at) and mode.at[c] <= j
        ]  # fmt: skip
        return bools[-1] if bools else None

    def _light(self, plan: Plan) -> tuple[list | None, PerturbingMode, BaseException | None]:
        """The light forward of ``plan``: the first look, when ``plan`` is the first round's
        (every escape) and it ran, else a forward now. The first look perturbed every call
        it made; ``plan.moved`` keeps those the capture numbered."""
        if plan.direction != 1:
            return self._light_down(plan)
        first, self.first = self.first, None
        if first is None or plan.calls != frozenset(self.calls):
            # (a model whose intermediates drift by themselves has them left uncompared:
            # their fingerprints are not paid for)
            ran = self.runner.light(plan, fingerprints=not self._drift_known)
            if self.taken is not None:
                self.taken |= ran[1].reentered
            return ran
        plan.moved = first.mode.plan.moved & plan.calls
        if self.taken is not None:
            self.taken |= first.mode.reentered
        return first.output, first.mode, first.error

    def _light_down(self, plan: Plan) -> tuple[list | None, PerturbingMode, BaseException | None]:
        """The light forward of ``plan``, the other way: the first look's, when it ran one
        that perturbed just what ``plan`` would (every call it moved is one of
        ``plan.calls``; the others have no value to move that way), else a forward now."""
        down = self.first_down
        self.first_down = None
        if down is not None and down[1].plan.moved <= plan.calls:
            plan.moved = set(down[1].plan.moved)
            return down
        return self.runner.light(plan, fingerprints=not self._drift_known)

    # -- what moved -----------------------------------------------------------------------
    def _outputs_moved(self, got: list[torch.Tensor]) -> bool:
        want = expected_outputs(self.trace)
        return len(got) != len(want) or any(
            expected is not None and _moved(value, expected, self.atol, self.rtol)
            for value, expected in zip(got, want)
        )

    def _inside_moved(self, mode: PerturbingMode) -> bool:
        """Whether a value the light forward computed from the first escape on differs
        from the capture's, by its :func:`fingerprint` (beyond one part in a million of
        its magnitude): a dependency through an escape can end in an intermediate no
        output reads (a cache, a statistic kept on the module). Compared while the two
        ran the same calls."""
        pairs: dict[torch.device, tuple[list, list]] = {}  # compared where they lie
        groups = recorded_groups(self.trace)
        for i, (name, prints, ops) in enumerate(zip(mode.calls, mode.prints or (), groups)):
            if name != ops[0].func_name:
                break  # (from here the two are not aligned)
            if prints is None or len(prints) != len(ops):
                continue  # (outputs the capture records its own way)
            for value, theirs in zip(prints, self._capture_prints(i, ops)):
                if value is not None and theirs is not None and theirs[0].device == value[0].device:
                    ours, saved = pairs.setdefault(value[0].device, ([], []))
                    ours.extend(value)
                    saved.extend(theirs)
        for ours, saved in pairs.values():
            a, b = torch.stack(ours).view(-1, 2), torch.stack(saved).view(-1, 2)
            if ((a - b).abs() > (a[:, 1:].abs() + b[:, 1:].abs()) * 1e-6).any():
                return True
        return False

    def _capture_prints(self, i: int, ops: list[Any]) -> list[tuple | None]:
        """The fingerprints of the saved values of ``ops``, the capture's ``i``-th call
        from the first escape on (None where a value is not compared: uninitialised
        memory, ``x.new(size)``, which differs run to run; a value not saved). Made once
        per call: each light forward whose outputs stayed is compared with them."""
        prints = self._saved_prints.get(i)
        if prints is None:
            prints = self._saved_prints[i] = [saved_fingerprint(op) for op in ops]
        return prints

    def _drifts(self) -> bool:
        """Whether a light forward with nothing perturbed computes other values than the
        capture did, too: the model's own (state kept between calls, a nondeterministic
        kernel), which the escapes cannot be blamed for. Noted; the intermediates of
        such a model are left uncompared, as its outputs matched. Asked once."""
        if self._drift_known is not None:
            return self._drift_known
        self._drift_known = True
        _, control, err = self.runner.light(Plan(()))
        if err is None and control.diverged is None and not self._inside_moved(control):
            self._drift_known = False
            return False
        self.decisions.append(
            "values computed after the first escape differ from the capture's in a forward "
            "with nothing perturbed (state kept between calls, or nondeterministic "
            "kernels): intermediates were not compared for hidden dependencies"
        )
        return True

    def _targets(self, moved: Trace, end: int | None) -> dict[str, int]:
        """Ops (and constants) of the aligned part where a change began: changed at all
        while none of their recorded parents did, with their place in op order. Only
        those whose change grew beyond the tolerance table somewhere (themselves, or an
        op their change reached) are kept: a change just under the tolerance that a
        later op amplifies (a dropout's ``1 / (1 - p)``) is blamed where it began, not
        on the op that made it visible."""
        tol = self.atol, self.rtol
        origins: dict[str, frozenset[str]] = {}  # changed record -> where its change began
        places: dict[str, int] = {}
        shown: set[str] = set()  # origins whose change grew beyond the tolerance
        for source in self.trace.sources:
            if source.kind == "constant" and source.label in moved:
                other = moved[source.label]
                if _record_moved(source, other, 0.0, 0.0):
                    origins[source.label] = frozenset({source.label})
                    first = min((self.trace[c].index for c in source.children), default=0)
                    places[source.label] = first
                    if _record_moved(source, other, *tol):
                        shown.add(source.label)
        for op in self.trace.ops[:end]:
            other = moved[op.label]
            if not _record_moved(op, other, 0.0, 0.0):
                continue
            reached = frozenset().union(*(origins.get(p, ()) for p in op.parents))
            if not reached:
                reached = frozenset({op.label})
                if op.func_name not in MAY_BE_UNINITIALIZED:  # (uninitialised memory
                    places[op.label] = op.index  # moves by itself: never a target)
            origins[op.label] = reached
            if reached - shown and _record_moved(op, other, *tol):
                shown |= reached
        return {label: places[label] for label in places if label in shown}

    def _without_drift(self, targets: dict[str, int]) -> dict[str, int]:
        """``targets`` less those a captured forward with nothing perturbed moves too (a
        model that reseeds itself from the OS, as Reformer does in training): the model's
        own, not the escapes'. That forward is made once, and only when there are targets
        and the ground-truth arm saw the model differ from itself already."""
        if not targets:
            return targets
        if (
            self._drifting is None
            and not self.findings.differs_from_itself
            and not any(failure.arm == "ground_truth" for failure in self.findings.failures)
        ):
            self._drifting = set()  # (a rerun matched the capture: a deterministic model)
        if self._drifting is None:
            control, err = self.runner.captured(Plan(()))
            if control is None or err is not None:
                self._drifting = set()
            else:
                end = _structure_divergence(self.trace, control)
                self._drifting = {
                    record.label
                    for record in (*self.trace.sources, *self.trace.ops[:end])
                    if record.label in control
                    and _record_moved(record, control[record.label], 0.0, 0.0)
                }
                if end is not None:  # (past a divergence nothing is compared: keep all)
                    self._drifting |= {op.label for op in self.trace.ops[end:]}
            if self._drifting:
                self.decisions.append(
                    f"{len(self._drifting)} value(s) differ from the capture's in a captured "
                    "forward with nothing perturbed (state kept between calls, or randomness "
                    "the model draws from outside torch's seed): they are not blamed on escapes"
                )
        return {label: at for label, at in targets.items() if label not in self._drifting}

    # -- hidden edges ---------------------------------------------------------------------
    def _attribute(self, plan: Plan, targets: dict[str, int], data_only: bool = False) -> None:
        """Hidden edges to ``targets``. With one escape perturbed, from it; with a few (at
        most MAX_ATTRIBUTION_RUNS), one captured forward per escape, each alone: a target
        moved by one escape can hide another's behind it (its parent moved too); with
        more, group testing (:meth:`_bisect`). Targets left unattributed go to the
        nearest escape before them."""
        moved = sorted(c for c in plan.moved if not (data_only and self.calls[c][0].control))
        if not targets or not moved:
            return
        last = max(targets.values())  # (an escape after every target moved none of them)
        moved = [c for c in moved if self.calls[c][0].index <= last] or moved
        found: dict[int, dict[str, int]] = {}
        if len(moved) == 1:
            found[moved[0]] = targets
        else:
            if len(moved) <= MAX_ATTRIBUTION_RUNS:
                for call in moved:
                    found[call] = self._moved_by([call])
            else:  # group testing: halves of the set, into those that move something
                left = [MAX_GROUP_RUNS]
                self._bisect(moved, found, left)
                if left[0] <= 0:
                    self.decisions.append(
                        f"attributing hidden edges among {len(moved)} escapes stopped after "
                        f"{MAX_GROUP_RUNS} captured forwards; targets left go to the nearest "
                        "escape before them"
                    )
            found = {call: hits for call, hits in found.items() if hits}
            attributed = {t for ts in found.values() for t in ts}
            for target, index in targets.items():
                before = [c for c in moved if self.calls[c][0].index <= index]
                if target not in attributed and before:
                    found.setdefault(before[-1], {})[target] = index
        for call, hits in sorted(found.items()):
            for escape in self.calls[call]:
                for target in sorted(hits, key=hits.__getitem__):
                    self._edge(escape, target)

    def _moved_by(self, calls: list[int]) -> dict[str, int]:
        """The targets a captured forward with only ``calls`` perturbed moves."""
        run, err = self.runner.captured(Plan(set(calls), self.direction))
        if run is None or err is not None:
            return {}
        return self._without_drift(self._targets(run, _structure_divergence(self.trace, run)))

    def _bisect(self, calls: list[int], found: dict[int, dict[str, int]], left: list[int]) -> None:
        """Group testing over ``calls``, a set of escapes that moves something together:
        each half is perturbed alone, and the halves that move something are split again,
        so n escapes of which k matter cost about 2k log2(n) captured forwards (at most
        ``left[0]``, counted down)."""
        middle = len(calls) // 2
        for half in (calls[:middle], calls[middle:]):
            if left[0] <= 0:
                return
            left[0] -= 1
            hits = self._moved_by(half)
            if not hits:
                continue
            if len(half) == 1:
                found[half[0]] = hits
            else:
                self._bisect(half, found, left)

    def _edge(self, escape: Escape, target: str) -> None:
        if target == escape.label or target in _descendants(self.trace, escape.label):
            return  # the graph has a path already: lineage is complete
        edge = HiddenEdge(escape.label, target, escape.via, escape.source)
        if edge not in self.edges:
            self.edges.append(edge)

    def _direct(self) -> list[HiddenEdge]:
        """The edges found, less those a chain of others carries: a value that escapes,
        comes back into a recorded op and escapes again further on moves the end through
        the second escape, so the edge from the first to the end is dropped (its two
        direct edges stay). Each edge kept makes its child ``incomplete``."""
        kept = [edge for edge in self.edges if not self._carried(edge)]
        for edge in kept:
            self.findings.incomplete(
                edge.child, ARM,
                f"hidden dependency {edge}: perturbing the escaped value moved "
                f"{edge.child!r}, but the graph has no edge for it (see trace.hidden_edges)",
            )  # fmt: skip
        return kept

    def _carried(self, edge: HiddenEdge) -> bool:
        """Whether another edge into ``edge.child`` starts at a record that ``edge.parent``
        reaches through recorded edges and the other hidden edges."""
        others = [e for e in self.edges if e.child == edge.child and e.parent != edge.parent]
        if not others:
            return False
        hidden: dict[str, list[str]] = {}
        for e in self.edges:
            if e != edge:
                hidden.setdefault(e.parent, []).append(e.child)
        reached = _descendants(self.trace, edge.parent, hidden)
        return any(e.parent in reached for e in others)

    # -- branch decisions -----------------------------------------------------------------
    def _decided(self, call: int | None, what: str) -> int | None:
        if call is None:
            return None
        escape = self.calls[call][0]
        text = f"branch decision: {escape} {what} when perturbed"
        if text not in self.decisions:
            self.decisions.append(text)
        return call

    def _last_before(self, plan: Plan, k: int) -> int | None:
        """The escape call that most likely decided a divergence at escape call ``k``:
        the last perturbed one before it, a bool (what ``if`` reads) if there is one."""
        calls = [c for c in sorted(plan.moved) if c < max(k, 1)] or sorted(plan.moved)[:1]
        return self._prefer_control(calls) if calls else None

    def _prefer_control(self, calls: list[int]) -> int:
        control = [c for c in calls if self.calls[c][0].control]
        return (control or calls)[-1]


def _two_way(escape: Escape) -> bool:
    """Whether the escaped value can be moved the other way too (see
    :func:`~torchlens.replay.escape_values.perturbed_down`): a number or an array or list
    of them, not a bool, not an int 0."""
    if escape.type in ("float", "ndarray", "list", "tuple", "complex"):
        return True
    return escape.type == "int" and escape.value != "0"


def _same_site(a: Escape, b: Escape) -> bool:
    """Two escapes read by one line of code through one call."""
    return a.source is not None and a.source == b.source and a.via == b.via


def _divergence(ran: list, recorded: list) -> int | None:
    """The first position (an escape call, a call) at which two runs differ, or None."""
    for k, (a, b) in enumerate(zip(ran, recorded)):
        if a != b:
            return k
    return None if len(ran) == len(recorded) else min(len(ran), len(recorded))


def _structure_divergence(trace: Trace, other: Trace) -> int | None:
    """The position of the first op at which ``other`` ran something else (another
    function, label or parents), or None when both ran the same ops."""
    step = attrgetter("label", "func_name", "parents")
    return _divergence(list(map(step, other.ops)), list(map(step, trace.ops)))


def _record_moved(record: Any, other: Any, atol, rtol) -> bool:
    if record.shape != other.shape or record.dtype != other.dtype:
        return True
    try:
        return _moved(other.out, record.out, atol, rtol)
    except PayloadUnavailableError:
        return False


def _moved(value: torch.Tensor, expected: torch.Tensor, atol, rtol) -> bool:
    """Whether ``value`` differs from ``expected`` beyond the tolerance table's, as
    :func:`~torchlens.replay.tolerances.differs` says, in one call for plain dense values
    (the question is asked of every output of every light forward)."""
    if value.shape != expected.shape or value.dtype != expected.dtype:
        return True
    plain = (
        type(value) in _PLAIN and type(expected) in _PLAIN and value.layout == torch.strided
        and expected.layout == torch.strided and value.device == expected.device
        and not value.is_meta and not value.is_quantized
    )  # fmt: skip
    if not plain:
        return differs(value, expected, atol, rtol)
    if value.is_floating_point() or value.is_complex():
        rtol_, atol_ = tolerance(value.dtype, atol, rtol)
        return not torch.allclose(value, expected, rtol_, atol_, equal_nan=True)
    return not torch.equal(value, expected)


def _descendants(trace: Trace, label: str, hidden: dict[str, list[str]] | None = None) -> set[str]:
    """The records ``label`` reaches through recorded edges and the ``hidden`` ones
    (parent -> children)."""
    seen: set[str] = set()
    stack = [label]
    while stack:
        node = stack.pop()
        children = trace[node].children if node in trace else ()
        for child in (*children, *(hidden or {}).get(node, ())):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def _what(err: BaseException | None) -> str:
    """What a perturbed forward that stopped did, in words."""
    if isinstance(err, OverBudget):
        return f"changed how long the run is (it was stopped past {err.what})"
    if err is None:
        return "raised nothing"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"raised {type(err).__name__}" + (f" ({text[:60]})" if text else "")
