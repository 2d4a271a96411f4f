"""Reports for people: ``doctor()`` checks the installation against what torchlens needs;
``trace_info(path)`` says what a saved trace directory holds.

Example:
    >>> import torchlens as tl
    >>> print(tl.report.doctor())  # doctest: +ELLIPSIS
    torchlens doctor
    ...
"""

from torchlens.report._doctor import DoctorReport, OptionalPiece, doctor, torch_support
from torchlens.report._saved import trace_info

__all__ = ["DoctorReport", "OptionalPiece", "doctor", "torch_support", "trace_info"]
