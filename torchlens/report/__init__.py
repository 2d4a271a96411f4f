"""Reports for people: ``doctor()`` checks the installation against what torchlens needs.

Example:
    >>> import torchlens as tl
    >>> print(tl.report.doctor())  # doctest: +ELLIPSIS
    torchlens doctor
    ...
"""

from torchlens.report._doctor import DoctorReport, OptionalPiece, doctor, torch_support

__all__ = ["DoctorReport", "OptionalPiece", "doctor", "torch_support"]
