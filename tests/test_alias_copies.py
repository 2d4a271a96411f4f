"""Saved aliases of one storage copied together before a write (capture/alias_copies.py)."""

from __future__ import annotations

import torch

from torchlens.capture.alias_copies import copies_before_write


def _base(copy: torch.Tensor) -> int:
    return copy.untyped_storage().data_ptr()


def test_the_same_view_saved_twice_is_copied_once():
    whole = torch.randn(4, 6)
    row_a, row_b = whole[1], whole[1]  # two saved values of one view
    copies = dict(copies_before_write([("a", row_a), ("b", row_b)]))
    assert copies["a"] is copies["b"]
    assert copies["a"].data_ptr() != row_a.data_ptr()
    torch.testing.assert_close(copies["a"], row_a, rtol=0, atol=0)


def test_slices_inside_a_dense_value_become_views_of_its_copy():
    whole = torch.randn(4, 6)
    before = whole.clone()
    column, block = whole[:, 2], whole[1:3, 2:5]
    copies = dict(copies_before_write([("col", column), ("whole", whole), ("block", block)]))
    assert _base(copies["col"]) == _base(copies["whole"]) == _base(copies["block"])
    assert _base(copies["whole"]) != _base(whole)
    assert copies["col"].stride() == column.stride() and copies["block"].stride() == (6, 1)
    whole.add_(1)  # the write the copies were made for
    torch.testing.assert_close(copies["col"], before[:, 2], rtol=0, atol=0)
    torch.testing.assert_close(copies["block"], before[1:3, 2:5], rtol=0, atol=0)


def test_a_value_inside_a_strided_one_gets_a_copy_of_its_own():
    whole = torch.randn(4, 6)
    every_other = whole[:, ::2]  # not dense: its copy is contiguous, it holds no views
    inside = whole[:, 2]
    copies = dict(copies_before_write([("every_other", every_other), ("inside", inside)]))
    assert _base(copies["inside"]) != _base(copies["every_other"])
    torch.testing.assert_close(copies["inside"], inside, rtol=0, atol=0)


def test_aliases_of_other_storages_or_dtypes_are_never_shared():
    a, b = torch.randn(8), torch.randn(8)
    ints = a.view(torch.int32)
    copies = dict(copies_before_write([("a", a), ("b", b), ("ints", ints)]))
    assert len({_base(copy) for copy in copies.values()}) == 3
    torch.testing.assert_close(copies["b"], b, rtol=0, atol=0)
    assert torch.equal(copies["ints"], ints)


def test_a_lazily_conjugated_or_negated_view_never_shares_a_copy():
    """``x`` and ``x.conj()`` lie in one storage with one geometry, but hold other values:
    neither may be served the other's copy, whichever is copied first."""
    x = torch.randn(4, dtype=torch.complex64)
    for aliases in ([("conj", x.conj()), ("x", x)], [("x", x), ("conj", x.conj())]):
        copies = dict(copies_before_write(aliases))
        assert torch.equal(copies["x"], x) and not copies["x"].is_conj()
        assert torch.equal(copies["conj"], x.conj())
    y = torch.randn(4)
    negated = torch._neg_view(y)
    for aliases in ([("neg", negated), ("y", y)], [("y", y), ("neg", negated)]):
        copies = dict(copies_before_write(aliases))
        assert torch.equal(copies["y"], y) and torch.equal(copies["neg"], -y)
