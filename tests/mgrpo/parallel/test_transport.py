"""The transport's buckets (the moves themselves run under torchrun in test_megatron.py: the
megatron policy's weights, moments and syncs go through it, in one bucket and in several), and its
bucketed all-reduce on two real gloo ranks."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mgrpo.parallel.transport import all_reduce_in_buckets, buckets

LAYOUT = {
    "b": torch.Size([1000]),  # 4 kB in fp32
    "a": torch.Size([10, 100]),  # 4 kB
    "c": torch.Size([3]),
    "d": torch.Size([2000]),  # 8 kB
}


def test_every_name_is_in_one_bucket_in_name_order():
    for mb in (0.0, 0.004, 0.01, 256.0):
        got = buckets(LAYOUT, 4, mb)
        assert [n for b in got for n in b] == sorted(LAYOUT), mb
        assert all(got), mb


def test_a_bucket_closes_once_it_holds_bucket_mb():
    assert buckets(LAYOUT, 4, 256.0) == [["a", "b", "c", "d"]]
    assert buckets(LAYOUT, 4, 0.0) == [["a"], ["b"], ["c"], ["d"]]
    assert buckets(LAYOUT, 4, 0.004) == [["a"], ["b"], ["c", "d"]]  # c alone is 12 bytes
    assert buckets(LAYOUT, 4, 0.006) == [["a", "b"], ["c", "d"]]


def _tensors(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    shapes = [(3, 5), (7,), (2, 2, 2), (11,), (1,)]
    return [
        torch.randn(s, generator=g, dtype=torch.float64 if i == 1 else torch.float32)
        for i, s in enumerate(shapes)
    ]


BUCKET_MB = (0.0, 0.00005, 64.0)  # one tensor a bucket, a few, all of a dtype in one


def _reduce_on(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    results = []
    for bucket_mb in BUCKET_MB:
        mine = _tensors(rank)
        all_reduce_in_buckets(mine, dist.group.WORLD, bucket_mb)
        results.append(mine)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def test_all_reduce_in_buckets_sums_every_tensor_in_place(tmp_path):
    expected = [a + b for a, b in zip(_tensors(0), _tensors(1), strict=True)]
    mp.spawn(_reduce_on, args=(f"file://{tmp_path / 'store'}", str(tmp_path / "out.pt")), nprocs=2)
    for bucket_mb, got in zip(BUCKET_MB, torch.load(tmp_path / "out.pt"), strict=True):
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert g.dtype == e.dtype and torch.allclose(g, e), (bucket_mb, i)
