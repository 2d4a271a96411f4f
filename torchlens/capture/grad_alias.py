"""Records whose gradient autograd merges with another record's, so no hook can give it alone.

A hook on the node that produced a value receives everything autograd sends to that node.
That is exactly the record's gradient, except where autograd's graph joins what the trace
keeps apart:

* **passthrough** — an op returned its input tensor itself (``x.contiguous()`` on a
  contiguous ``x``): one node, two records. Exact only if the input had no other consumer.
* **writes through a view** — ``h[:, :2] += 1`` rebases ``h`` onto a ``CopySlices`` node that
  runs the write's backward itself, bypassing the view's own node. The write, the views it
  went through, and (when an older view of the same storage is read again afterwards) the
  base's later values cannot be separated.
* **composite multi-output calls** — ``lstm_cell`` computes ``h`` from ``c``; the node of
  ``c`` also receives what flows back through ``h`` inside the call.

:class:`AliasTracker` notes what it needs while the forward runs and, at the end, names those
records with the reason; they then raise ``grad_aliased`` instead of giving a wrong value.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from torchlens._tensors import storage_key, version_of

__all__ = ["AliasTracker"]

Tensor = torch.Tensor
_MAX_NODES = 10_000  # bound on the walk inside one multi-output call


class AliasTracker:
    """Collects, per op, what :meth:`ambiguous` needs; holds autograd nodes only until then."""

    def __init__(self) -> None:
        self.passthrough: dict[str, str] = {}  # op label -> label whose tensor it returned
        self.storage: dict[str, tuple[Any, int | None]] = {}  # label -> (storage, version)
        self.views: set[str] = set()  # op labels whose value was a view
        self.view_writes: list[str] = []  # in-place ops that wrote into a view
        self.view_refreshes: list[str] = []  # views re-read after their storage was written
        self.nodes: dict[int, list[tuple[str, Any, int]]] = defaultdict(list)  # call -> outputs
        self.owner: dict[int, int] = {}  # id(node) -> call index of the op that produced it

    def note(self, op: Any, tensor: Tensor, alias_of: str | None, node: Any) -> None:
        """Remember one op's value (called during the forward, for ops that require grad)."""
        label = op.label
        if alias_of is not None and not op.is_inplace:
            self.passthrough[label] = alias_of
        self.storage[label] = (storage_key(tensor), version_of(tensor))
        if tensor._base is not None:
            self.views.add(label)
            if op.is_inplace or op.func_name == "setitem":
                self.view_writes.append(label)
            elif op.func is None:  # a refresh of a view whose storage was written
                self.view_refreshes.append(label)
        if node is not None:
            self.nodes[op.call_index].append((label, node, tensor.output_nr))
            self.owner.setdefault(id(node), op.call_index)

    def ambiguous(self, trace: Any) -> dict[str, str]:
        """Label -> why its gradient cannot be told apart; drops the nodes it held."""
        found: dict[str, str] = {}
        self._passthrough(trace, found)
        self._view_writes(trace, found)
        self._rebuilt_views(trace, found)
        self._multi_output(found)
        self.nodes.clear()
        self.owner.clear()
        return found

    def _passthrough(self, trace: Any, found: dict[str, str]) -> None:
        for label, parent in self.passthrough.items():
            if self._shared(trace, label):
                found[label] = (
                    f"{label!r} returned the very tensor of {parent!r}, which is also used "
                    f"elsewhere, so autograd keeps one gradient for both; read {parent!r}'s "
                    "grad (the total over all uses) instead"
                )

    def _shared(self, trace: Any, label: str) -> bool:
        """Whether the tensor ``label`` returned had consumers other than the chain to it."""
        parent = self.passthrough.get(label)
        while parent is not None:  # a loop, not a nested recursive closure: no ref cycle
            if any(child != label for child in trace[parent].children):
                return True
            label, parent = parent, self.passthrough.get(parent)
        return False

    def _view_writes(self, trace: Any, found: dict[str, str]) -> None:
        for label in self.view_writes:
            reason = (
                f"{label!r} wrote in place through a view; autograd folds that write into "
                "the base tensor's CopySlices node, so the gradient of the view and of "
                "the write itself cannot be read separately; read the base tensor's grad"
            )
            stack = [label]
            while stack:  # the write and the views it went through
                current = stack.pop()
                if current in found:
                    continue
                found[current] = reason
                stack += [
                    ref.label
                    for ref in trace[current].parent_args
                    if ref.label in self.views
                    and self.storage.get(ref.label, (None,))[0] == self.storage[label][0]
                ]
        outputs = set(trace.output_labels)
        first_write: dict[Any, int] = {}
        for label in self.view_writes:
            key, version = self.storage[label]
            first_write[key] = min(first_write.get(key, version or 0), version or 0)
        for view in self.view_writes + self.view_refreshes:
            # the view's node hangs off the base's node of its version, which chains back
            # through every write since the first: if the view is read again, the base
            # records of those versions receive its gradient too
            readers = [c for c in trace[view].children if trace[c].func is not None]
            key, version = self.storage[view]
            if (not readers and view not in outputs) or key not in first_write:
                continue
            for label, (other, at) in self.storage.items():
                if (
                    other == key
                    and label not in self.views
                    and first_write[key] <= (at or 0) <= (version or 0)
                ):
                    found.setdefault(
                        label,
                        f"{label!r} shares its storage with the view {view!r}, which was "
                        "written in place and read again; autograd sends that view's "
                        "gradient into this tensor's node too, so its own cannot be read",
                    )

    def _rebuilt_views(self, trace: Any, found: dict[str, str]) -> None:
        """Views read again after their storage was written through another view.

        Autograd gives such a view a new node on the base's ``CopySlices`` when it is read
        again, so what flows back through that read reaches the base without passing the
        view's own node: its hook misses that part (it sees only earlier reads).
        """
        outputs = set(trace.output_labels)
        for refresh in self.view_refreshes:
            stale = trace[refresh].parent_args[0].label
            if stale not in self.views or not (trace[refresh].children or refresh in outputs):
                continue
            found.setdefault(
                stale,
                f"{stale!r} is a view whose storage was written in place through another "
                f"view before {refresh!r} read it again; autograd then gives it a new node on "
                "the base's CopySlices, so the gradient of that read bypasses this record's "
                f"own node; read {refresh!r}'s grad, or the base tensor's",
            )

    def _multi_output(self, found: dict[str, str]) -> None:
        for call, outputs in self.nodes.items():
            if len(outputs) < 2 or len({id(node) for _, node, _ in outputs}) < 2:
                continue  # one node with several output slots keeps them apart
            slots = {(id(node), nr): label for label, node, nr in outputs}
            for label, node, _ in outputs:
                for reached in self._reachable(node, call, slots):
                    if reached != label:
                        found.setdefault(
                            reached,
                            f"{reached!r} is computed inside the same call as {label!r}, "
                            f"which is built from it, so autograd sends {label!r}'s gradient "
                            f"into {reached!r}'s node as well",
                        )

    def _reachable(self, start: Any, call: int, slots: dict) -> set[str]:
        """Sibling outputs of ``call`` that autograd reaches from ``start`` inside the call."""
        reached, seen, stack = set(), {id(start)}, [start]
        while stack and len(seen) < _MAX_NODES:
            node = stack.pop()
            for nxt, nr in node.next_functions:
                if nxt is None:
                    continue
                if (id(nxt), nr) in slots:
                    reached.add(slots[(id(nxt), nr)])
                owner = self.owner.get(id(nxt))
                if id(nxt) in seen or (owner is not None and owner != call):
                    continue  # a node of an earlier record: outside this call
                seen.add(id(nxt))
                stack.append(nxt)
        return reached
