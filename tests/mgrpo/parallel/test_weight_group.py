"""The packing of a push by broadcast into SGLang's flattened buckets (`mgrpo.parallel.weight_group`);
the broadcasts themselves are tested between processes in tests/services/test_engine_server.py."""

import pytest
import torch

from mgrpo.engines.sglang import SGLangEngine, SGLangError
from mgrpo.parallel.weight_group import byte_buckets, flatten_bytes, unflatten_bytes


def test_buckets_keep_the_order_and_stay_under_the_cap_unless_one_tensor_is_larger():
    assert byte_buckets([10, 10, 10, 25, 5], 20) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert byte_buckets([4, 4, 4], 12) == [range(0, 3)]  # exactly the cap fits
    assert byte_buckets([30], 20) == [range(0, 1)]
    assert byte_buckets([], 20) == []


def test_mixed_dtypes_pack_into_bytes_and_come_back_as_views_in_place():
    tensors = [torch.randn(3, 4), torch.arange(5), torch.randn(2, 3).to(torch.bfloat16), torch.ones(())]
    packed = flatten_bytes(tensors)
    assert packed.dtype == torch.uint8 and packed.numel() == 48 + 40 + 12 + 4
    back = unflatten_bytes(packed, [t.dtype for t in tensors], [list(t.shape) for t in tensors])
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(tensors, back, strict=True))
    back[1].fill_(7)  # views: what the receiver copies from is the buffer it received into
    assert torch.equal(packed[48:88].view(torch.int64), torch.full((5,), 7))
    with pytest.raises(ValueError, match="does not hold"):
        unflatten_bytes(packed, [torch.float32], [[3, 4]])


def test_a_bad_bucket_size_says_which_variable_to_fix(monkeypatch):
    monkeypatch.setenv("MGRPO_SGLANG_WEIGHT_BUCKET_MB", "-1")
    with pytest.raises(SGLangError, match="MGRPO_SGLANG_WEIGHT_BUCKET_MB='-1'"):
        SGLangEngine("http://127.0.0.1:1")
    monkeypatch.setenv("MGRPO_SGLANG_WEIGHT_BUCKET_MB", "0.5")
    assert SGLangEngine("http://127.0.0.1:1").weight_bucket_bytes == 2**19
