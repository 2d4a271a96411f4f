"""Saving and loading traces: a few verbs and a lazy handle.

* :func:`save` writes a finished trace to a directory: ``manifest.json`` (sorted-key JSON with
  the graph, op metadata, argument templates and versions) plus safetensors files for the
  values and RNG snapshots. Saving the same trace twice gives the same bytes.
* :func:`load` reads it back; values are read from disk on first access. Nothing is
  unpickled or executed: functions are looked up by name in torch's own namespaces.
* ``tl.trace(model, x, stream_to=path)`` writes values as they are produced through
  :class:`StreamWriter`, which this package registers as capture's streaming sink.

``Trace.save(path)`` is the same as ``save(trace, path)``; the method imports this package
lazily, so the data model does not depend on io.
"""

from torchlens.capture import register_stream_sink
from torchlens.io._load import load
from torchlens.io._save import save
from torchlens.io._stream import StreamWriter

__all__ = ["save", "load", "StreamWriter"]

register_stream_sink(StreamWriter)
