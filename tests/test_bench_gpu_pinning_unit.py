"""The slab that ``python -m bench.gpu.pinning`` copies a commit into (the measurement itself
needs CUDA): each tensor gets an aligned view of its own dtype and shape, and the copies are
equal to the originals. No Ray, no GPU (the slab is not pinned here)."""
import torch

from bench.gpu.pinning import ALIGN, slab_bytes, slab_copies, slab_views


def test_a_slab_holds_every_tensor_aligned_and_the_copies_equal_them():
    tensors = [torch.randn(3, 5), torch.arange(7, dtype=torch.int64),
               torch.randn(2, 2).to(torch.bfloat16), torch.ones((), dtype=torch.float16)]
    assert slab_bytes(tensors) == 4 * ALIGN  # each under ALIGN bytes: one ALIGN each
    copies = slab_copies(tensors, pin=False)
    for copy, tensor in zip(copies, tensors):
        assert copy.dtype == tensor.dtype and copy.shape == tensor.shape
        assert torch.equal(copy, tensor)
        assert copy.data_ptr() % ALIGN == copies[0].data_ptr() % ALIGN  # aligned alike
    base = copies[0].untyped_storage().data_ptr()
    assert all(c.untyped_storage().data_ptr() == base for c in copies)  # one block


def test_views_follow_one_another_without_overlap():
    tensors = [torch.zeros(100), torch.zeros(1)]  # 400 bytes: two ALIGN units
    slab = torch.zeros(slab_bytes(tensors), dtype=torch.uint8)
    first, second = slab_views(slab, tensors)
    first.fill_(1.0)
    assert second.item() == 0.0
    assert second.data_ptr() - first.data_ptr() == 2 * ALIGN
