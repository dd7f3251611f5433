"""A TensorDataset's batches are gathered in one indexing per tensor (issue 12), and they are the
batches the per-sample path and PyTorch's default collate give, tensor for tensor."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

from baton.schemas.spec import DataSpec
from baton.workers.training.builtins.data import TensorPairs, spiral
from baton.workers.training.data import DataPlan, GatheredLoader, Loading, TensorBatches, whole_batch


def _plan(base, **data) -> DataPlan:
    spec = DataSpec.model_validate({"target": "builtin:spiral", "batch_size": 7, "val_fraction": 0.25, **data})
    return DataPlan.build(base, Loading(spec, seed=5))


def _per_sample(loader) -> list:
    """The same batches through ``__getitem__`` and ``default_collate`` (the path before gathering)."""
    view = loader.dataset.view if isinstance(loader.dataset, TensorBatches) else loader.dataset
    return [default_collate([view[p] for p in positions]) for positions in loader.batch_sampler]


def _assert_same_batches(got: list, expected: list) -> None:
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and x.is_contiguous()
            assert torch.equal(x, y)


class Columns(TensorDataset):
    """A user's TensorDataset subclass that keeps torch's __getitem__."""


class Relabelled(TensorDataset):
    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x, y + 1


def _many_columns(n: int = 53) -> TensorDataset:
    """Columns of several dtypes and layouts: 4-D channels_last, int64 labels, float64 and bool
    per-sample scalars, a transposed half-precision matrix, 2-D int8."""
    gen = torch.Generator().manual_seed(0)
    return Columns(torch.rand(n, 3, 4, 4, generator=gen).to(memory_format=torch.channels_last),
                   torch.randint(0, 9, (n,), generator=gen), torch.rand(n, dtype=torch.float64, generator=gen),
                   torch.rand(n, generator=gen) > 0.5, torch.rand(5, n, generator=gen).half().t(),
                   torch.randint(-100, 100, (n, 2), generator=gen).to(torch.int8))


@pytest.mark.parametrize("make", [lambda: spiral(seed=3, n_per_class=20), _many_columns], ids=["spiral", "many-columns"])
def test_gathered_batches_equal_the_default_collates(make):
    plan = _plan(make())
    for epoch, start in ((0, 0), (1, 2)):
        loader = plan.train_batches(epoch, start_batch=start)
        assert isinstance(loader.dataset, TensorBatches)
        _assert_same_batches(list(loader), _per_sample(loader))
    val = plan.val_loader()
    assert isinstance(val.dataset, TensorBatches)
    _assert_same_batches(list(val), _per_sample(val))


def test_a_gathered_loader_gives_what_a_dataloader_of_the_same_batches_gives():
    """In this process and unpinned, the batches skip the DataLoader (its per-batch machinery cost a
    small model a few per cent a step); pinned, they still go through one, which pins them."""
    plan = _plan(_many_columns())
    loader = plan.train_batches(2, start_batch=1)
    assert isinstance(loader, GatheredLoader) and len(loader) == plan.batches_per_pass - 1
    through = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=whole_batch)
    _assert_same_batches(list(loader), list(through))
    pinned = Loading(plan.loading.spec, seed=5, pin_memory=True)
    assert isinstance(pinned.loader(loader.dataset.view, 0, batch_sampler=loader.batch_sampler), DataLoader)


def test_a_data_parallel_ranks_share_is_gathered_alike():
    from baton.workers.training.sharding import ShardedPlan

    loader = ShardedPlan(_plan(_many_columns()), rank=1, world_size=2).train_batches(1, start_batch=1)
    assert isinstance(loader.dataset, TensorBatches)
    _assert_same_batches(list(loader), _per_sample(loader))


def test_a_batch_is_gathered_by_one_indexing_per_tensor_not_per_sample(monkeypatch):
    plan = _plan(spiral(seed=3, n_per_class=20))
    calls = []
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: calls.append(i))
    assert len(list(plan.train_batches(0))) == plan.batches_per_pass and calls == []


@pytest.mark.parametrize("case", ["jitter", "collate", "loader-workers", "own-getitem", "not-tensors", "uint32", "sparse"])
def test_samples_are_loaded_one_by_one_where_gathering_would_change_them(case):
    data = {"num_workers": 1} if case == "loader-workers" else {}
    if case == "collate":
        data["collate"] = {"target": "torch.utils.data:default_collate"}
    base = {
        "jitter": lambda: TensorPairs(torch.rand(40, 2), torch.zeros(40, dtype=torch.long), jitter=0.1),
        "own-getitem": lambda: Relabelled(torch.rand(40, 2), torch.zeros(40, dtype=torch.long)),
        "not-tensors": lambda: [(torch.rand(2), 0)] * 40,
        "uint32": lambda: TensorDataset(torch.rand(40, 2), torch.arange(40).to(torch.uint32)),  # no 1-D index_select
        "sparse": lambda: TensorDataset(torch.rand(40, 2).to_sparse(), torch.arange(40)),
    }.get(case, lambda: spiral(seed=3, n_per_class=20))()
    plan = _plan(base, **data)
    if case == "collate":
        plan.loading.collate = default_collate
    assert not isinstance(plan.train_batches(0).dataset, TensorBatches)
    # validation is never augmented: only jitter leaves its batches gathered
    assert isinstance(plan.val_loader().dataset, TensorBatches) is (case == "jitter")
    if case == "own-getitem":  # its samples are what its __getitem__ returns
        (x, y), *_ = plan.train_batches(0)
        assert torch.equal(y, torch.ones_like(y))


@pytest.mark.gpu
def test_a_tensor_dataset_held_on_the_gpu_is_gathered_there():
    base = TensorDataset(torch.rand(40, 3, device="cuda"), torch.arange(40, device="cuda"))
    plan = _plan(base)
    loader = plan.train_batches(0)
    assert isinstance(loader.dataset, TensorBatches)
    _assert_same_batches(list(loader), _per_sample(loader))
