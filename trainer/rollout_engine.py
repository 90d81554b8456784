"""The rollout engine: generation with SGLang's memory API.

Memory, by tag (`miles_profile.names`):
- `weights`: the engine's own copy of the policy (bf16 on CUDA, fp32 on CPU), one flat buffer.
- `kv_cache`: a pool allocated up front, `kv_cache_bytes` in size (`kv_cache.KVPool`).
- `cuda_graph`: captured decode steps and their memory pool (CUDA, when enabled).

How memory goes and comes back is the memory backend's (`memory_backend`): `builtin` frees storages
and empties torch's cache, `torch_memory_saver` allocates each tag in its own region and pauses it.

Semantics, as in SGLang with torch_memory_saver:
- `release_memory_occupation(tags)` frees that memory for real (CUDA: back to the driver; host:
  unmapped), inside the call. Released weights are discarded unless the engine was built with
  `weights_cpu_backup=True`, which copies them to host memory first and restores them on resume.
- `resume_memory_occupation(tags)` reallocates in the order cuda_graph -> weights -> kv_cache. Resumed
  KV is zeroed; resumed weights without a backup are zeros and must be refilled by
  `update_weights_from_tensor` before the engine serves again. With `builtin` graphs are re-captured
  once weights and KV are both present (they hold raw addresses, see `cuda_graphs`); with
  `torch_memory_saver` the addresses survive, the graphs are kept and never captured again
  (`graph_captures` counts captures).
- `update_weights_from_tensor(named_tensors)` copies each tensor into the existing weight buffer
  (casting dtype in the copy): no second copy of the weights is ever allocated, so callers send chunks.
  An update starts with the first tensor sent while the weights are complete and ends when every
  parameter has been received; until then `generate` refuses to run, so the engine never serves a mix
  of old and new weights. A completed update flushes the cache.
- `flush_cache()` zeroes the KV pool (there is no prefix cache to drop between calls).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

import miles_profile as mp
from miles_profile.names import (BUILTIN, CUDA_GRAPH, KV_CACHE, OFFLOADED_STATE, PAUSED, PINNED_BUFFERS, TAGS,
                                 TORCH_MEMORY_SAVER, WEIGHTS)
from trainer import cuda_graphs
from trainer.config import ModelConfig
from trainer.errors import EngineError
from trainer.flat import FlatParams
from trainer.kv_cache import KVPool
from trainer.memory_backend import engine_memory
from trainer.model import GPT
from trainer.offload import host_buffer

RESUME_ORDER = (CUDA_GRAPH, WEIGHTS, KV_CACHE)


class RolloutEngine:
    def __init__(self, cfg: ModelConfig, device: torch.device, kv_cache_bytes: int,
                 cuda_graph: bool = False, weights_cpu_backup: bool = False, memory_backend: str = BUILTIN):
        self.cfg, self.device = cfg, device
        self.memory = engine_memory(memory_backend)
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        with torch.device("meta"):
            self.model = GPT(cfg).eval()
        with self.memory.region(WEIGHTS, cpu_backup=weights_cpu_backup):
            self.weights = FlatParams(self.model, device, self.dtype, requires_grad=False)
        self.weights.flat.zero_()
        self._params = dict(self.weights.views(self.weights.flat))
        self._missing = set(self._params)  # parameters not yet filled by the current update
        self._updating = False
        with self.memory.region(KV_CACHE):
            self.kv = KVPool(cfg, kv_cache_bytes, device, self.dtype)
        self._weights_backed_up = weights_cpu_backup
        self._backup = (host_buffer(self.weights.flat) if weights_cpu_backup and not self.memory.backs_up_weights
                        else None)
        self._use_graphs = cuda_graph and device.type == "cuda"  # turned off if a capture fails
        self._graphs_released = False
        self._graphs: dict[tuple[int, int], cuda_graphs.DecodeGraph] = {}
        self._graph_bytes = self._last_graph_bytes = 0
        self._last_shape: tuple[int, int] | None = None
        self.graph_captures = 0  # graphs captured so far: torch_memory_saver never captures one again
        self.declare_memory()

    # --- generation -----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, response_len: int, seed: int,
                 temperature: float = 1.0) -> torch.Tensor:
        """prompts (N, P) int64 -> sampled responses (N, R) int64 on CPU."""
        self._check_can_serve()
        generator = torch.Generator(self.device).manual_seed(seed)
        seq_len = prompts.shape[1] + response_len
        step = min(len(prompts), self.kv.max_batch(seq_len))
        out = [self._generate_batch(prompts[i:i + step].to(self.device), response_len, generator, temperature)
               for i in range(0, len(prompts), step)]
        return torch.cat(out).cpu()

    def _generate_batch(self, prompts: torch.Tensor, response_len: int, generator: torch.Generator,
                        temperature: float) -> torch.Tensor:
        B, P = prompts.shape
        kv = self.kv.views(B, P + response_len)
        decode = self._decoder(kv, B, P + response_len)
        logits = self.model(prompts, kv)[:, -1]  # prefill; (B, V)
        tokens = []
        for t in range(response_len):
            probs = F.softmax(logits.float() / temperature, dim=-1)
            tokens.append(torch.multinomial(probs, 1, generator=generator))  # (B, 1)
            if t + 1 < response_len:
                logits = decode(tokens[-1], P + t)[:, -1]
        return torch.cat(tokens, dim=1)

    def _decoder(self, kv, batch: int, seq_len: int):
        """A captured graph for this shape when graphs are on, else an eager decode step."""
        if self._use_graphs and not self._graphs_released:
            self._last_shape = (batch, seq_len)
            if (batch, seq_len) not in self._graphs:
                self._capture(batch, seq_len)
            if (batch, seq_len) in self._graphs:
                return self._graphs[(batch, seq_len)]
        return lambda tokens, pos: self.model(tokens, kv, torch.tensor([pos], device=self.device))

    def _capture(self, batch: int, seq_len: int) -> None:
        graph, nbytes = cuda_graphs.capture(self.model, self.kv.views(batch, seq_len), batch, self.memory.graph)
        if graph is None:
            self._use_graphs = False
            return
        self.graph_captures += 1
        self._graphs[(batch, seq_len)] = graph
        # builtin frees the warm-up's leftovers with the graph (empty_cache); a pause frees the capture's pool
        self._graph_bytes += graph.capture_bytes if self.memory.keeps_graphs else nbytes
        self._last_graph_bytes = self._graph_bytes
        self.declare_memory()

    def declare_memory(self) -> None:
        """What the engine holds where, for the recorder's ledger (miles_profile.account, docs/ledger.md):
        called after every change. A no-op when nothing records."""
        where = "host" if self.device.type == "cpu" else str(self.device)
        mp.account(WEIGHTS, self.weights_bytes if self._held(WEIGHTS) else 0, where, owner="engine")
        mp.account(KV_CACHE, self.kv.nbytes if self._held(KV_CACHE) else 0, where, owner="engine")
        if self.device.type == "cuda":
            mp.account(CUDA_GRAPH, self._graph_bytes if self._held(CUDA_GRAPH) else 0, where, owner="engine")
        if self.memory.name == TORCH_MEMORY_SAVER:  # paused tags stay in the allocator's counters
            paused = (0 if self._held(WEIGHTS) else self.weights_bytes) + (0 if self._held(KV_CACHE) else self.kv.nbytes)
            if self.memory.keeps_graphs and self._graphs_released:
                paused += self._graph_bytes
            mp.account(PAUSED, paused, where, owner="engine")
        if self._backup is not None:  # our own host copy: it holds the weights only while they are away
            away = not self._held(WEIGHTS)
            mp.account(OFFLOADED_STATE, self._backup.nbytes if away else 0, "host", owner="engine")
            mp.account(PINNED_BUFFERS, 0 if away else self._backup.nbytes, "host", owner="engine")

    def _held(self, tag: str) -> bool:
        """Whether `tag`'s memory is on the device now (graphs: whether any graph memory is held)."""
        if tag == WEIGHTS:
            return self.memory.held(WEIGHTS, [self.weights.flat])
        if tag == KV_CACHE:
            return self.memory.held(KV_CACHE, [self.kv.buffer])
        return bool(self._graphs) and self.memory.held(CUDA_GRAPH, [])

    def _check_can_serve(self) -> None:
        if not self._held(WEIGHTS):
            raise EngineError("generate called while the engine's weights are released")
        if not self._held(KV_CACHE):
            raise EngineError("generate called while the KV cache is released")
        if self._missing:
            raise EngineError(f"weights incomplete: {len(self._missing)} of {len(self._params)} tensors "
                              "not updated yet; refusing to serve a mix of old and new weights")

    # --- memory API -----------------------------------------------------------------------------

    def occupied_bytes(self, tags: Sequence[str]) -> int:
        """Bytes that releasing `tags` would free from the engine's device (host on a CPU run)."""
        tags = _check_tags(tags)
        total = 0
        if WEIGHTS in tags and self._held(WEIGHTS):
            total += self.weights_bytes
        if KV_CACHE in tags and self._held(KV_CACHE):
            total += self.kv.nbytes
        # builtin: graphs point into weights and KV and go whenever either goes; torch_memory_saver
        # keeps them, and only the cuda_graph tag releases their memory
        graph_tags = {CUDA_GRAPH} if self.memory.keeps_graphs else {CUDA_GRAPH, WEIGHTS, KV_CACHE}
        if self._held(CUDA_GRAPH) and set(tags) & graph_tags:
            total += self._graph_bytes
        if WEIGHTS in tags and self._backup is not None and self.device.type == "cpu":
            total -= self.weights_bytes  # the backup stays
        return max(total, 0)

    def released_bytes(self, tags: Sequence[str]) -> int:
        """Bytes that resuming `tags` would allocate again (graphs: their size when last captured)."""
        tags = _check_tags(tags)
        total = 0
        if WEIGHTS in tags and not self._held(WEIGHTS):
            total += self.weights_bytes
        if KV_CACHE in tags and not self._held(KV_CACHE):
            total += self.kv.nbytes
        if CUDA_GRAPH in tags and self._use_graphs:
            # builtin: graphs are captured again once both buffers are back; torch_memory_saver:
            # their paused memory comes back
            back = self._graphs_released and bool(self._graphs) if self.memory.keeps_graphs else not self._graphs
            total += self._last_graph_bytes if back else 0
        return total

    def release_memory_occupation(self, tags: Sequence[str]) -> None:
        tags = _check_tags(tags)
        if self._graphs and not self.memory.keeps_graphs:  # they point into weights and KV
            self._graphs.clear()
            self._graph_bytes = 0
        if CUDA_GRAPH in tags:
            self._graphs_released = True
            self.memory.release(CUDA_GRAPH, [])
        if WEIGHTS in tags and self._held(WEIGHTS):
            self._release_weights()
        if KV_CACHE in tags and self._held(KV_CACHE):
            self.memory.release(KV_CACHE, [self.kv.buffer])
        self.memory.settle(self.device)
        self.declare_memory()

    def resume_memory_occupation(self, tags: Sequence[str]) -> None:
        tags = _check_tags(tags)
        for tag in RESUME_ORDER:
            if tag == CUDA_GRAPH and tag in tags:
                self.memory.resume(CUDA_GRAPH, [])
                self._graphs_released = False
            elif tag == WEIGHTS and tag in tags and not self._held(WEIGHTS):
                self._resume_weights()
            elif tag == KV_CACHE and tag in tags and not self._held(KV_CACHE):
                self.memory.resume(KV_CACHE, [self.kv.buffer])
                self.kv.clear()
        if CUDA_GRAPH in tags and self._use_graphs and self._last_shape and self._can_capture():
            self._capture(*self._last_shape)
        self.declare_memory()

    def _can_capture(self) -> bool:
        return self._held(WEIGHTS) and self._held(KV_CACHE) and not self._graphs

    def _release_weights(self) -> None:
        if self._backup is not None:
            self._backup.copy_(self.weights.flat)
        elif not self._weights_backed_up:  # the bytes are lost: a full update must refill them
            self._missing = set(self._params)
            self._updating = False
        self.memory.release(WEIGHTS, [self.weights.flat])

    def _resume_weights(self) -> None:
        self.memory.resume(WEIGHTS, [self.weights.flat])
        if self._backup is not None:
            self.weights.flat.copy_(self._backup)
        elif not self._weights_backed_up:
            self.weights.flat.zero_()

    # --- weights --------------------------------------------------------------------------------

    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy a chunk of (name, tensor) into the existing weight buffers; see the module docstring."""
        if not self._held(WEIGHTS):
            raise EngineError("update_weights_from_tensor called while the engine's weights are released")
        if not self._updating:
            self._missing, self._updating = set(self._params), True
        for name, tensor in named_tensors:
            dst = self._params.get(name)
            if dst is None or dst.shape != tensor.shape:
                raise EngineError(f"update_weights_from_tensor: no parameter {name} of shape {tuple(tensor.shape)}")
            dst.copy_(tensor, non_blocking=True)
            self._missing.discard(name)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the caller may reuse the source buffer right away
        if not self._missing:
            self._updating = False
            self.flush_cache()

    def flush_cache(self) -> None:
        if self._held(KV_CACHE):
            self.kv.clear()

    def close(self) -> None:
        """Resume whatever torch_memory_saver holds paused and hand its tags back, so another engine
        in this process may use them (a no-op with the builtin backend)."""
        self.memory.close()

    @property
    def memory_backend(self) -> str:
        return self.memory.name

    @property
    def weights_bytes(self) -> int:
        return self.weights.flat.numel() * self.weights.flat.element_size()

    @property
    def serving_ready(self) -> bool:
        return self._held(WEIGHTS) and self._held(KV_CACHE) and not self._missing


def _check_tags(tags: Sequence[str]) -> tuple[str, ...]:
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown memory tag(s) {unknown}; known: {list(TAGS)}")
    return tuple(tags)

