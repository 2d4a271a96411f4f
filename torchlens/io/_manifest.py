"""A Trace's records <-> the JSON manifest (everything but the tensors).

The manifest holds ops, sources, module calls, templates and metadata. Tensors live in
safetensors files: payloads in the entries the caller passes in, RNG snapshots in
``rng.safetensors`` under keys named here. An op whose function or arguments have no file
form is loaded with ``func=None`` and ``op.meta["replay_unavailable"]`` saying why, so replay
counts it unverified instead of guessing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchlens.capture import fill, flatten
from torchlens.io._encode import Unencodable, decode, encode, encode_output
from torchlens.io._funcs import UnresolvableFunc, func_ref, resolve_func
from torchlens.io._payloads import dtype_name, parse_dtype
from torchlens.trace import ArgRef, Escape, HiddenEdge, ModuleCall, Op, PayloadStore, Source, Trace

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "trace_to_manifest",
    "manifest_to_trace",
    "output_from_manifest",
    "rng_tensors",
]

FORMAT = "torchlens-trace"
FORMAT_VERSION = 1
REPLAY_UNAVAILABLE = "replay_unavailable"


def rng_tensors(trace: Trace) -> dict[str, torch.Tensor]:
    """Every RNG snapshot of ``trace`` by its key in ``rng.safetensors``."""
    tensors = {f"trace/{k}": v for k, v in (trace.rng_state or {}).items()}
    for op in trace.ops:
        for name, value in (op.rng_state or {}).items():
            tensors[f"call_{op.call_index}/{name}"] = value
    return tensors


def trace_to_manifest(trace: Trace, payloads: dict[str, dict], missing: dict) -> dict:
    """The manifest of ``trace``, given where its payloads were written."""
    meta, dropped = _encode_meta(trace.meta)
    return {
        "dropped_meta": dropped,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "input_labels": list(trace.input_labels),
        "meta": meta,
        "missing": {label: list(reason) for label, reason in sorted(missing.items())},
        "modules": [dataclasses.asdict(m) for m in trace.modules],
        "ops": [_op_to_json(op) for op in trace.ops],
        "output": _output_template(trace.output),
        "output_labels": list(trace.output_labels),
        "payloads": payloads,
        "rng_state": sorted(trace.rng_state or {}),
        "sources": [_source_to_json(s) for s in trace.sources],
        "torch_version": torch.__version__,
        "torchlens_version": str(trace.meta.get("torchlens_version", "")),
        # only when there are some: traces without escapes keep the bytes they had
        **({"escapes": [_located_to_json(e) for e in trace.escapes]} if trace.escapes else {}),
        **(
            {"hidden_edges": [_located_to_json(e) for e in trace.hidden_edges]}
            if trace.hidden_edges
            else {}
        ),
        # the proof kept with the trace (tl.trace(..., validate=True)), when there is one
        **({"status": trace.status.to_json()} if trace.status is not None else {}),
    }


def _op_to_json(op: Op) -> dict:
    meta, dropped = _encode_meta(op.meta)
    data = {
        "call_index": op.call_index,
        "children": list(op.children),
        "device": str(op.device),
        "dtype": dtype_name(op.dtype),
        "func": None,
        "func_name": op.func_name,
        "index": op.index,
        "is_inplace": op.is_inplace,
        "label": op.label,
        "meta": meta,
        "module": op.module,
        "module_stack": [list(frame) for frame in op.module_stack],
        "output_index": op.output_index,
        "parent_args": [[ref.label, ref.position] for ref in op.parent_args],
        "parents": list(op.parents),
        "requires_grad": op.requires_grad,
        "rng_state": sorted(op.rng_state) if op.rng_state is not None else None,
        "shape": list(op.shape),
    }
    if dropped:
        data["dropped_meta"] = dropped
    if op.func is not None:
        try:  # all three or none: "func" stays None
            data.update(
                args_template=encode(op.args_template),
                kwargs_template=encode(op.kwargs_template),
                func=func_ref(op.func),
            )
        except (Unencodable, UnresolvableFunc) as err:
            data[REPLAY_UNAVAILABLE] = f"{op.func_name}: {err}"
    return data


def _encode_meta(meta: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Encodable entries of ``meta``, and the sorted keys of those that are not."""
    kept, dropped = {}, []
    for key, value in meta.items():
        try:
            kept[str(key)] = encode(value)
        except Unencodable:
            dropped.append(str(key))
    return kept, sorted(dropped)


def _located_to_json(record: Escape | HiddenEdge) -> dict:
    source = record.source
    where = None if source is None else [str(source[0]), int(source[1]), str(source[2])]
    return {**dataclasses.asdict(record), "source": where}


def _line(value: Any) -> tuple[str, int, str] | None:
    if value is None:
        return None
    file, line, function = _list(value)
    return str(file), int(line), str(function)


def _escapes_from(data: dict) -> list[Escape]:
    """The escapes of a manifest (none in files written before they were recorded)."""
    return [
        Escape(_str(d["label"]), _str(d["via"]), _str(d["value"]), _str(d["type"]),
               int(d["index"]), int(d["call"]), _line(d.get("source")))
        for d in map(_dict, _list(data.get("escapes", [])))
    ]  # fmt: skip


def _hidden_from(data: dict) -> list[HiddenEdge]:
    return [
        HiddenEdge(_str(d["parent"]), _str(d["child"]), _str(d["via"]), _line(d.get("source")))
        for d in map(_dict, _list(data.get("hidden_edges", [])))
    ]


def _source_to_json(source: Source) -> dict:
    return {
        "children": list(source.children),
        "device": str(source.device),
        "dtype": dtype_name(source.dtype),
        "kind": source.kind,
        "label": source.label,
        "path": source.path,
        "requires_grad": source.requires_grad,
        "shape": list(source.shape),
    }


def _output_template(output: Any) -> dict:
    """The output's template, with the type names of the parts that load as None."""
    try:
        template, dropped = encode_output(flatten(output)[1])
    except Unencodable as err:
        return {"unavailable": str(err)}
    return {"template": template, **({"dropped": sorted(set(dropped))} if dropped else {})}


# -- loading ------------------------------------------------------------------------------
def manifest_to_trace(
    data: dict, store: PayloadStore, rng: dict[str, torch.Tensor], output: Any
) -> Trace:
    """A :class:`Trace` from a checked manifest; raises ``KeyError``/``TypeError``/
    ``ValueError`` on malformed content, which the caller reports as a corrupt manifest."""
    ops = [_op_from_json(d, store, rng) for d in _list(data["ops"])]
    sources = [_source_from_json(d, store) for d in _list(data["sources"])]
    modules = [_module_from_json(d) for d in _list(data["modules"])]
    trace_rng = {name: rng[f"trace/{name}"] for name in _list(data["rng_state"])}
    meta = {key: decode(value) for key, value in _dict(data["meta"]).items()}
    return Trace(
        ops=ops,
        sources=sources,
        modules=modules,
        input_labels=_strs(data["input_labels"]),
        output_labels=_strs(data["output_labels"]),
        output=output,
        store=store,
        rng_state=trace_rng or None,
        meta=meta,
        escapes=_escapes_from(data),
        hidden_edges=_hidden_from(data),
        status=_status_from(data),
    )


def _status_from(data: dict) -> Any:
    """The validation status kept with the trace, or None (files without one)."""
    if "status" not in data:
        return None
    from torchlens.replay import ReplayStatus

    return ReplayStatus.from_json(_dict(data["status"]))


def output_from_manifest(data: dict, store: PayloadStore) -> tuple[Any, str | None]:
    """What the model returned, rebuilt from its template and the output payloads, or
    ``None``; with the reason it (or a part of it) cannot be rebuilt."""
    spec = _dict(data["output"])
    if "template" not in spec:
        return None, str(spec.get("unavailable", "the output was not saved"))
    labels = _strs(data["output_labels"])
    if not all(store.has(label) for label in labels):
        return None, "the output values were not saved"
    output = fill(decode(spec["template"]), [store.get(label) for label in labels])
    dropped = ", ".join(_strs(spec.get("dropped", [])))
    if dropped:
        return output, f"values of type {dropped} in the output cannot be saved; they load as None"
    return output, None


def _op_from_json(d: dict, store: PayloadStore, rng: dict[str, torch.Tensor]) -> Op:
    op = Op(
        label=_str(d["label"]),
        index=int(d["index"]),
        func_name=_str(d["func_name"]),
        call_index=int(d["call_index"]),
        output_index=int(d["output_index"]),
        parents=tuple(_strs(d["parents"])),
        parent_args=tuple(ArgRef(_str(a), _str(b)) for a, b in _list(d["parent_args"])),
        module=_str(d["module"]),
        module_stack=tuple((_str(a), int(n)) for a, n in _list(d["module_stack"])),
        shape=tuple(int(n) for n in _list(d["shape"])),
        dtype=parse_dtype(d["dtype"]),
        device=torch.device(_str(d["device"])),
        requires_grad=bool(d["requires_grad"]),
        is_inplace=bool(d["is_inplace"]),
        children=_strs(d["children"]),
        meta={key: decode(value) for key, value in _dict(d["meta"]).items()},
    )
    op.store = store
    if d["rng_state"] is not None:
        op.rng_state = {n: rng[f"call_{op.call_index}/{n}"] for n in _strs(d["rng_state"])}
    if d["func"] is not None:
        try:
            op.func = resolve_func(d["func"])
            op.args_template = decode(d["args_template"])
            op.kwargs_template = decode(d["kwargs_template"])
        except UnresolvableFunc as err:  # e.g. written by a torch that had this function
            op.func, op.args_template, op.kwargs_template = None, (), {}
            op.meta[REPLAY_UNAVAILABLE] = f"{op.func_name}: {err}"
        if type(op.args_template) is not tuple or type(op.kwargs_template) is not dict:
            raise TypeError(f"bad argument templates for {op.label!r}")
    elif d.get(REPLAY_UNAVAILABLE):
        op.meta[REPLAY_UNAVAILABLE] = _str(d[REPLAY_UNAVAILABLE])
    return op


def _source_from_json(d: dict, store: PayloadStore) -> Source:
    source = Source(
        label=_str(d["label"]),
        kind=_str(d["kind"]),
        path=_str(d["path"]),
        shape=tuple(int(n) for n in _list(d["shape"])),
        dtype=parse_dtype(d["dtype"]),
        device=torch.device(_str(d["device"])),
        requires_grad=bool(d["requires_grad"]),
        children=_strs(d["children"]),
    )
    source.store = store
    return source


def _module_from_json(d: dict) -> ModuleCall:
    return ModuleCall(
        address=_str(d["address"]),
        call_index=int(d["call_index"]),
        module_type=_str(d["module_type"]),
        inputs=tuple(_strs(d["inputs"])),
        outputs=tuple(_strs(d["outputs"])),
        ops=tuple(_strs(d["ops"])),
    )


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _strs(value: Any) -> list[str]:
    return [_str(item) for item in _list(value)]


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _dict(value: Any) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value
