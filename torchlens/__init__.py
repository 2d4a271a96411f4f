"""torchlens: record every tensor operation of an eager PyTorch forward pass.

The flow of data is the layout of the package::

    model, args, kwargs
       -> capture session   (torchlens.capture: a TorchFunctionMode + module wrappers,
                             active only inside the call)
       -> Trace             (torchlens.trace: ordered Ops, graph edges, module calls,
                             payloads, RNG snapshots)
       -> validate / save / load / draw

Example:
    >>> import torch
    >>> import torchlens as tl
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    >>> trace = tl.trace(model, torch.randn(2, 4))
    >>> [op.func_name for op in trace]
    ['linear', 'relu', 'linear']
    >>> trace["linear_2"].module, trace["linear_2"].parents
    ('2', ('relu_1', '2.weight', '2.bias'))
    >>> print(trace)
    Trace: 3 ops, 5 sources (1 inputs), 4 module calls
    op        function  module call  shape   dtype
    --------  --------  -----------  ------  -------
    linear_1  linear    0:1          (2, 3)  float32
    relu_1    relu      1:1          (2, 3)  float32
    linear_2  linear    2:1          (2, 2)  float32
    outputs: linear_2
    >>> tl.validate(model, torch.randn(2, 4))
    True

Importing torchlens changes nothing in torch: interception exists only while a capture runs.
"""

from torchlens import backends, distributed, errors, report, viz
from torchlens._llm_sites import llm_sites
from torchlens._version import __version__
from torchlens.attention import attention_pattern
from torchlens.capture import Intervention, record, trace
from torchlens.debug import diff, find_nonfinite, summary
from torchlens.extract import extract, load_extraction
from torchlens.io import load, save
from torchlens.recording import Recording
from torchlens.replay import replay, validate
from torchlens.selectors import Selector, func, label, layer, module, where
from torchlens.trace import ModuleCall, Op, Source, Trace

__all__ = [
    "__version__",
    "errors",
    "backends",
    "report",
    "viz",
    "distributed",
    "trace",
    "record",
    "validate",
    "replay",
    "Recording",
    "Selector",
    "func",
    "module",
    "label",
    "where",
    "layer",
    "Intervention",
    "save",
    "load",
    "extract",
    "load_extraction",
    "diff",
    "find_nonfinite",
    "summary",
    "Trace",
    "Op",
    "Source",
    "ModuleCall",
    "attention_pattern",
    "llm_sites",
]
