"""The rollout engine's generation and memory API semantics (trainer/rollout_engine.py)."""
from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.errors import EngineError
from trainer.kv_cache import KVPool
from trainer.model import GPT, init_weights
from trainer.rollout_engine import RolloutEngine

CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=12)
CPU = torch.device("cpu")
KV_BYTES = 64 * CFG.max_seq_len * CFG.kv_bytes_per_token(4)


def _reference() -> GPT:
    model = GPT(CFG)
    init_weights(model, torch.Generator().manual_seed(0))
    return model


def _engine(**kw) -> tuple[RolloutEngine, GPT]:
    ref = _reference()
    engine = RolloutEngine(CFG, CPU, KV_BYTES, **kw)
    engine.update_weights_from_tensor(list(ref.named_parameters()))
    return engine, ref


def test_prefill_and_decode_match_a_full_forward():
    model = _reference().eval()
    tokens = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(1))
    full = model(tokens)
    kv = KVPool(CFG, KV_BYTES, CPU, torch.float32).views(3, 12)
    with torch.no_grad():
        steps = [model(tokens[:, :6], kv)]
        for t in range(6, 10):
            steps.append(model(tokens[:, t:t + 1], kv, torch.tensor([t])))
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_generate_is_seeded_and_shaped():
    engine, _ = _engine()
    prompts = torch.randint(0, 16, (5, 6), generator=torch.Generator().manual_seed(2))
    a, b = engine.generate(prompts, 4, seed=3), engine.generate(prompts, 4, seed=3)
    assert a.shape == (5, 4) and a.dtype == torch.long and torch.equal(a, b)
    assert not torch.equal(a, engine.generate(prompts, 4, seed=4))


def test_a_batch_larger_than_the_pool_is_split_with_the_same_result():
    engine, _ = _engine()
    small = RolloutEngine(CFG, CPU, 2 * CFG.max_seq_len * CFG.kv_bytes_per_token(4))  # 2 sequences
    small.update_weights_from_tensor(list(_reference().named_parameters()))
    prompts = torch.randint(0, 16, (5, 6), generator=torch.Generator().manual_seed(2))
    # Sampling draws from one generator in order, so splitting changes the draws but not validity.
    out = small.generate(prompts, 4, seed=3)
    assert out.shape == (5, 4) and int(out.max()) < CFG.vocab_size


def test_released_memory_is_refused_then_resumed():
    engine, _ = _engine()
    prompts = torch.zeros(2, 6, dtype=torch.long)
    engine.release_memory_occupation(["kv_cache"])
    assert engine.occupied_bytes(["kv_cache"]) == 0 and engine.released_bytes(["kv_cache"]) == engine.kv.nbytes
    with pytest.raises(EngineError, match="KV cache is released"):
        engine.generate(prompts, 2, seed=0)
    engine.resume_memory_occupation(["kv_cache"])
    assert torch.count_nonzero(engine.kv.buffer) == 0  # resumed KV is zeroed
    engine.generate(prompts, 2, seed=0)


def test_released_weights_are_discarded_without_backup():
    engine, ref = _engine()
    engine.release_memory_occupation(["weights", "cuda_graph"])
    with pytest.raises(EngineError, match="weights are released"):
        engine.generate(torch.zeros(1, 6, dtype=torch.long), 2, seed=0)
    engine.resume_memory_occupation(["weights"])
    assert torch.count_nonzero(engine.weights.flat) == 0
    with pytest.raises(EngineError, match="weights incomplete"):
        engine.generate(torch.zeros(1, 6, dtype=torch.long), 2, seed=0)
    engine.update_weights_from_tensor(list(ref.named_parameters()))
    assert engine.serving_ready


def test_cpu_backup_restores_released_weights():
    engine, _ = _engine(weights_cpu_backup=True)
    before = engine.weights.flat.clone()
    assert engine.occupied_bytes(["weights"]) == 0  # on a CPU run the backup keeps the bytes in RSS
    engine.release_memory_occupation(["weights"])
    engine.resume_memory_occupation(["weights"])
    assert torch.equal(engine.weights.flat, before) and engine.serving_ready


def test_partial_update_never_serves_mixed_weights():
    engine, ref = _engine()
    params = list(ref.named_parameters())
    engine.update_weights_from_tensor(params[:3])
    with pytest.raises(EngineError, match="refusing to serve a mix"):
        engine.generate(torch.zeros(1, 6, dtype=torch.long), 2, seed=0)
    engine.update_weights_from_tensor(params[3:])
    engine.generate(torch.zeros(1, 6, dtype=torch.long), 2, seed=0)


def test_update_writes_in_place_into_the_existing_buffer():
    engine, ref = _engine()
    ptr = engine.weights.flat.data_ptr()
    new = {n: torch.full_like(p, 0.5) for n, p in ref.named_parameters()}
    engine.update_weights_from_tensor(new.items())
    assert engine.weights.flat.data_ptr() == ptr and torch.all(engine.weights.flat == 0.5)


def test_update_rejects_unknown_or_misshapen_tensors():
    engine, _ = _engine()
    with pytest.raises(EngineError, match="no parameter"):
        engine.update_weights_from_tensor([("nope", torch.zeros(1))])
    with pytest.raises(EngineError, match="no parameter"):
        engine.update_weights_from_tensor([("head.bias", torch.zeros(3))])


def test_unknown_tag_is_rejected():
    engine, _ = _engine()
    with pytest.raises(ValueError, match="unknown memory tag"):
        engine.release_memory_occupation(["activations"])


def test_pool_too_small_for_one_sequence():
    with pytest.raises(EngineError, match="less than one sequence"):
        KVPool(CFG, 100, CPU, torch.float32)


def test_an_engine_process_builds_its_model_without_torchs_python_meta_kernels():
    """The engine builds its model on the meta device. torch's meta kernel of `normal_` (nn.Embedding's
    default init) is Python: the first call imports torch._dynamo and sympy, about 820 modules, 1.0 CPU-s and
    23.7 MiB of heap in every engine server. A meta weight has nothing to initialise; this keeps it so."""
    import subprocess
    import sys
    from tests.conftest import python_env
    program = ("import sys, torch\n"
               "from trainer.config import ModelConfig\n"
               "from trainer.rollout_engine import RolloutEngine\n"
               "before = set(sys.modules)\n"
               f"RolloutEngine(ModelConfig(**{CFG.__dict__!r}), torch.device('cpu'), {KV_BYTES})\n"
               "print(sorted(set(sys.modules) - before))\n")
    done = subprocess.run([sys.executable, "-c", program], env=python_env(), capture_output=True, text=True,
                          timeout=120, check=True)
    imported = done.stdout.strip()
    assert "torch._dynamo" not in imported and "sympy" not in imported, imported[:500]
