"""The private copy of the user's inputs keeps the memory they share."""

from __future__ import annotations

import torch

from fsdpviz.trace.copy import index_range, inputs_copy


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    return t.untyped_storage()


def test_one_tensor_under_two_names_is_one_copy() -> None:
    ids = torch.randint(5, 90, (2, 12))
    args, kwargs = inputs_copy({"input_ids": ids, "labels": ids})
    assert args == ()
    assert kwargs["input_ids"] is kwargs["labels"]
    assert kwargs["labels"].device.type == "meta" and kwargs["labels"].shape == ids.shape
    assert _storage(kwargs["labels"]).nbytes() == ids.nbytes
    # the embedding's range check names the first place the tensor was passed
    assert index_range(kwargs["labels"]) == ("input_ids", int(ids.min()), int(ids.max()))


def test_views_of_one_tensor_share_one_copied_storage() -> None:
    batch = torch.arange(2 * 17).reshape(2, 17)
    _, kwargs = inputs_copy({"tokens": batch[:, :-1], "targets": batch[:, 1:]})
    tokens, targets = kwargs["tokens"], kwargs["targets"]
    assert _storage(tokens) is _storage(targets)
    assert _storage(tokens).nbytes() == batch.nbytes  # the batch's storage, once
    for copy, view in ((tokens, batch[:, :-1]), (targets, batch[:, 1:])):
        assert (copy.shape, copy.stride(), copy.storage_offset()) == (
            view.shape, view.stride(), view.storage_offset()
        )  # fmt: skip
    # each view keeps the range of its own values
    assert index_range(targets) == ("targets", 1, 33)


def test_a_tensor_in_a_dict_and_a_list_and_positional() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    _, kwargs = inputs_copy({"x": x, "extra": {"again": [x, x[1:]]}})
    again = kwargs["extra"]["again"]
    assert again[0] is kwargs["x"] and kwargs["x"].requires_grad
    assert _storage(again[1]) is _storage(kwargs["x"])
    args, _ = inputs_copy((x, [x, x.t()]))
    assert args[1][0] is args[0] and _storage(args[1][1]) is _storage(args[0])
    assert args[1][1].stride() == x.t().stride()


def test_real_copies_share_among_themselves_not_with_the_user() -> None:
    batch = torch.arange(12.0).reshape(3, 4)
    _, kwargs = inputs_copy({"a": batch[:2], "b": batch[1:], "c": batch}, "real")
    a, b, c = kwargs["a"], kwargs["b"], kwargs["c"]
    assert _storage(a) is _storage(b) is _storage(c)
    assert torch.equal(a, batch[:2]) and torch.equal(b, batch[1:])
    c.zero_()
    assert batch.sum() == 66.0 and a.sum() == 0.0  # the user's batch is untouched


def test_a_tensor_that_is_not_strided_is_copied_alone() -> None:
    sparse = torch.eye(3).to_sparse()
    args, _ = inputs_copy((sparse, sparse))
    assert args[0] is args[1] and args[0].is_sparse and args[0].device.type == "meta"


def test_a_batch_cut_from_a_larger_tensor_copies_the_batch() -> None:
    data = torch.arange(1000).reshape(100, 10)
    _, kwargs = inputs_copy({"x": data[20:22, :-1], "y": data[20:22, 1:]})
    assert _storage(kwargs["x"]) is _storage(kwargs["y"])
    assert _storage(kwargs["x"]).nbytes() == 2 * 10 * 8  # rows 20 and 21, not all 100
    _, real = inputs_copy({"x": data[20:22, :-1], "y": data[20:22, 1:]}, "real")
    assert torch.equal(real["x"], data[20:22, :-1]) and torch.equal(real["y"], data[20:22, 1:])
    assert _storage(real["x"]).nbytes() == 160


def test_views_of_one_storage_in_two_dtypes() -> None:
    x = torch.arange(6, dtype=torch.int64)
    words = x.view(torch.int32)[3:9]
    args, _ = inputs_copy((x[1:], words), "real")
    assert _storage(args[0]) is _storage(args[1])
    assert torch.equal(args[0], x[1:]) and torch.equal(args[1], words)
    meta, _ = inputs_copy((x[1:], words))
    assert [(t.storage_offset(), t.shape) for t in meta] == [
        (t.storage_offset() - s, t.shape) for t, s in ((x[1:], 1), (words, 2))
    ]
