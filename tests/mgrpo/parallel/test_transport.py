"""The transport's buckets (the moves themselves run under torchrun in test_megatron.py: the
megatron policy's weights, moments and syncs go through it, in one bucket and in several)."""

import torch

from mgrpo.parallel.transport import buckets

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
