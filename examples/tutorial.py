import torch
from torch import nn

import torchlens as tl
from torchlens.backends.registry import get_backend_spec

model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
x = torch.randn(2, 4)

trace = tl.trace(model, x)
print([op.func_name for op in trace])
assert tl.validate(model, x, scope="forward")

protocol = get_backend_spec("torch").protocol()
print(protocol.name, protocol.maturity, protocol.materialization)
reference = protocol.reference_output(model, x, None)
captured = protocol.capture(model, x, None)
status = protocol.validate(captured, reference)
assert status.state == "passed", status
