"""Parameters as views into one flat buffer (trainer/flat.py)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.config import ModelConfig
from trainer.flat import FlatParams, alloc_storage, free_storage, is_allocated
from trainer.model import GPT

CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=10)


def _flat_model():
    with torch.device("meta"):
        model = GPT(CFG)
    return model, FlatParams(model, torch.device("cpu"), torch.float32, requires_grad=True)


def test_parameters_are_views_of_the_flat_buffer():
    model, flat = _flat_model()
    assert flat.numel == sum(p.numel() for p in model.parameters()) == CFG.num_params()
    flat.flat.copy_(torch.arange(flat.numel, dtype=torch.float32))
    for (name, p), slot in zip(model.named_parameters(), flat.slots):
        assert p.untyped_storage().data_ptr() == flat.flat.untyped_storage().data_ptr()
        assert p.flatten()[0].item() == slot.offset and name == slot.name


def test_free_and_alloc_keep_every_view_valid():
    model, flat = _flat_model()
    flat.flat.fill_(1.0)
    free_storage(flat.flat)
    assert not is_allocated(flat.flat) and model.head.weight.untyped_storage().nbytes() == 0
    alloc_storage(flat.flat)
    flat.flat.fill_(2.0)
    assert torch.all(model.head.weight == 2.0)
    out = model(torch.zeros(1, 3, dtype=torch.long))
    assert out.shape == (1, 3, CFG.vocab_size)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200_000))
def test_chunk_ranges_cover_the_buffer_at_parameter_boundaries(max_bytes):
    _, flat = _flat_model()
    ranges = flat.chunk_ranges(max_bytes, itemsize=4)
    assert ranges[0][0] == 0 and ranges[-1][1] == flat.numel
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    starts = {s.offset for s in flat.slots} | {flat.numel}
    for start, end in ranges:
        assert start in starts and end in starts
        one_slot = any(s.offset == start and s.offset + s.numel == end for s in flat.slots)
        assert (end - start) * 4 <= max_bytes or one_slot
    names = [n for r in ranges for n, _ in flat.views(flat.flat, *r)]
    assert names == [s.name for s in flat.slots]  # every parameter in exactly one chunk


def test_views_of_a_chunk_buffer_are_indexed_from_its_start():
    _, flat = _flat_model()
    flat.flat.copy_(torch.randn(flat.numel))
    start, end = flat.chunk_ranges(4096, 4)[1]
    chunk = flat.flat[start:end].clone()
    for (name, a), (_, b) in zip(flat.views(chunk, start, end, buffer_start=start), flat.views(flat.flat, start, end)):
        assert torch.equal(a, b), name
