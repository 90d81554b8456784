"""The memory forecast: from the flags alone, the expected peak of every phase on every device.

`forecast(cfg)` replays the loop of `train.py` (setup, then each rollout in the order the flags pick)
on byte counters instead of tensors: it allocates nothing and makes no CUDA call, so a plan for an
H200 configuration runs on any laptop. Each phase's peak is the highest level the
phase passes through (the level it starts at, each allocation, each transient), and per phase name
the highest of its instances, with the categories that made it up.

Devices: `cuda` (what torch's caching allocator counts: `memory_allocated`) and `host` (bytes the
trainer itself puts in host memory: offload buffers, a host optimizer, disk staging; on a CPU run
every tensor). The process's own footprint (interpreter, torch, CUDA libraries) is not forecast.

Where each number comes from (docs/forecast.md has the measured comparison):
- training state: fp32 params, grads, AdamW moments (`actor.TrainModel`), per model;
- engine: bf16 weights on CUDA (fp32 on CPU) and the KV pool rounded down to whole tokens;
- training step on CUDA under bf16 autocast: every linear weight's bf16 copy (held until its
  backward), 36 bytes x d_model per token per layer of saved activations (fp32 residual inputs of
  both LayerNorms 4+4, bf16 inputs of qkv and fc 2+2, qkv output 6, attention output 2, fc output
  and GELU output 8+8), and at the start of backward the largest weight's bf16 gradient with its
  fp32 cast (6 bytes per element). On CPU everything is fp32: 64 bytes x d_model, no weight copies;
- prefill: 10 x d_model activations per prompt token live at once (the block's input held by the
  caller, the residual, the fc output and the GELU output);
- cuBLAS workspaces (32 MiB each): one per stream or thread that ran a matmul (the main stream, the
  graph warm-up stream, the capture, the autograd thread), all cleared by each engine release
  (`memory_backend.settle`) and made again by the next matmul on each;
- a weight update from host memory (offloaded state, host optimizer) stages each parameter on the
  device in fp32 before the bf16 cast: the largest parameter's fp32 bytes; to an engine server the
  client copies each chunk into a buffer of its own (the largest chunk).
With `--rollout-engine server` the engine's memory is forecast in its own process (`process="engine"`),
for the phases that process opens.
With torch_memory_saver a paused region leaves the device but the allocator still counts it:
`allocator` is what torch reports, `peak` what the device holds.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from miles_profile.names import (CLEAR_MEMORY, CUDA_GRAPH, GENERATE, KV_CACHE, OFFLOAD_KV, OFFLOAD_ROLLOUT,
                                 OFFLOAD_TRAIN, OFFLOAD_WEIGHTS, ONLOAD_KV, ONLOAD_TRAIN, ONLOAD_WEIGHTS,
                                 TORCH_MEMORY_SAVER, TRAIN, UPDATE_WEIGHTS, WEIGHTS)
from trainer.config import model_config
from trainer.plan_shapes import max_chunk_numel, param_numels, train_activation_bytes

CUBLAS_WORKSPACE_BYTES = 32 * 1024**2  # torch's default cuBLAS workspace on Hopper (sm_90)
CATEGORIES = ("params", "gradients", "optimizer", "weights", "kv_cache", "workspace", "activations",
              "generation", "weight_update", "offload_buffers", "staging")
DEVICES = ("cuda", "host")


@dataclass(frozen=True)
class PhasePeak:
    phase: str
    device: str                 # "cuda" or "host"
    peak: int                   # bytes the device holds at the phase's highest point
    allocator: int              # what torch's allocator counts then (== peak without torch_memory_saver)
    breakdown: dict[str, int]   # category -> bytes at that point (allocator's view)
    process: str = "trainer"    # "engine": the rollout engine's own process (--rollout-engine server)


@dataclass(frozen=True)
class Plan:
    device: str                     # the run's compute device: "cuda" or "cpu"
    assumptions: dict[str, object]  # what the forecast took as given (backends, workers, sizes)
    phases: tuple[PhasePeak, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {"version": 1, "device": self.device, "assumptions": self.assumptions,
                "phases": [vars(p) for p in self.phases]}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        return cls(data["device"], dict(data.get("assumptions", {})),
                   tuple(PhasePeak(**p) for p in data.get("phases", [])))

    def peak(self, phase: str, device: str, process: str = "trainer") -> PhasePeak | None:
        return next((p for p in self.phases if (p.phase, p.device, p.process) == (phase, device, process)), None)


# --- the replay ----------------------------------------------------------------------------------

TRAINER, ENGINE = "trainer", "engine"
# Phases the engine's own process opens when it is a server (trainer/engine_server.py).
ENGINE_PHASES = {GENERATE, OFFLOAD_ROLLOUT, OFFLOAD_KV, OFFLOAD_WEIGHTS, ONLOAD_WEIGHTS, ONLOAD_KV, UPDATE_WEIGHTS}


class _Lanes:
    """Byte counters per (process, device) and category; each phase records the highest point it passes."""

    def __init__(self, processes: tuple[str, ...]):
        self.held = {(proc, dev): Counter() for proc in processes for dev in DEVICES}
        self.paused = {lane: Counter() for lane in self.held}  # torch_memory_saver: gone, still counted
        self.peaks: dict[tuple[str, str, str], PhasePeak] = {}
        self._phase: str | None = None

    def begin(self, name: str) -> None:
        self._phase = name
        self.snapshot()

    def snapshot(self, extra: dict[tuple[str, str], dict[str, int]] | None = None) -> None:
        for (proc, dev), held in self.held.items():
            if proc == ENGINE and self._phase not in ENGINE_PHASES:
                continue
            held = held + Counter((extra or {}).get((proc, dev), {}))
            counted = held + self.paused[(proc, dev)]
            peak, allocator = sum(held.values()), sum(counted.values())
            key = (self._phase, proc, dev)
            best = self.peaks.get(key)
            if best is None or allocator > best.allocator or (allocator == best.allocator and peak > best.peak):
                self.peaks[key] = PhasePeak(self._phase, dev, peak, allocator,
                                            {c: int(b) for c, b in sorted(counted.items()) if b}, proc)

    def add(self, lane: tuple[str, str], category: str, nbytes: int) -> None:
        self.held[lane][category] += nbytes
        self.snapshot()

    def free(self, lane: tuple[str, str], category: str, nbytes: int, pause: bool = False) -> None:
        self.held[lane][category] -= nbytes
        if pause:
            self.paused[lane][category] += nbytes
        self.snapshot()

    def resume(self, lane: tuple[str, str], category: str, nbytes: int) -> None:
        self.paused[lane][category] -= nbytes
        self.add(lane, category, nbytes)


@dataclass
class _Run:
    """What the replay needs of a configuration, in bytes, and where each side's memory lives."""
    state: dict[str, int]          # category -> training-state bytes on the compute device
    state_host: dict[str, int]     # category -> training-state bytes in host memory (host optimizer)
    offload_host: int              # host bytes of the offloader's own copies (pinned buffers / backup)
    disk: bool                     # --offload-train-target disk: host tensors go to files too
    staging: int                   # disk staging, allocated at the first offload (cuda)
    update: dict[tuple[str, str], int]  # lane -> transient of one weight update from offloaded state
    engine_weights: int
    kv: int
    prefill: int
    decode: int
    train: dict[str, int]
    train_saver: bool
    engine_saver: bool
    dev: tuple[str, str]           # the trainer's compute lane: (trainer, cuda) or (trainer, host)
    eng: tuple[str, str]           # the engine's lane: the trainer's, or its server process's
    host: tuple[str, str] = (TRAINER, "host")


def forecast(cfg, clears_workspaces: bool = True, cpu_count: int | None = None) -> Plan:
    """`cfg`: a `trainer.args.RunConfig`. Pure: no tensor, no CUDA call. `clears_workspaces=False`
    models the trainer before commit d37e03b, whose engine release left cuBLAS's workspaces in place.
    `cpu_count`: the cores of the machine that runs it (disk offload threads; default: this one's)."""
    run, assumptions = _sizes(cfg, cpu_count or os.cpu_count() or 4)
    server = cfg.rollout_engine == "server"
    lanes = _Lanes((TRAINER, ENGINE) if server else (TRAINER,))
    g = _Graphs(run.dev[1] == "cuda" and cfg.cuda_graph, clears_workspaces)
    for cat, b in run.state.items():  # the actor's constructor: no phase
        lanes.held[run.dev][cat] += b
    for cat, b in run.state_host.items():
        lanes.held[run.host][cat] += b
    actor = {"offloaded": False, "buffers": False}
    if cfg.offload_train:
        _offload_train(lanes, run, actor)
    lanes.held[run.eng]["weights"] += run.engine_weights
    lanes.held[run.eng]["kv_cache"] += run.kv
    engine = {WEIGHTS: True, KV_CACHE: True}
    _update_weights(lanes, run, actor)
    step = _rollout_gpu_peak if cfg.colocate_memory_peak_device == "gpu" else _rollout_cpu_peak
    before = None
    for _ in range(cfg.num_rollout):
        step(lanes, run, cfg, actor, engine, g)
        after = _replay_state(lanes, actor, engine, g)
        if after == before:  # a rollout that changed nothing: every later one repeats it
            break  # (--num-rollout 100000 took 12 s here before the first rollout began)
        before = after
    cuda = run.dev[1] == "cuda"
    order = {name: i for i, name in enumerate(dict.fromkeys(k[0] for k in lanes.peaks))}
    phases = sorted((p for p in lanes.peaks.values() if cuda or p.device == "host"),
                    key=lambda p: (p.process != TRAINER, order[p.phase], DEVICES.index(p.device)))
    return Plan(cfg.device, {**assumptions, "clears_workspaces": clears_workspaces}, tuple(phases))


def _replay_state(lanes: _Lanes, actor: dict, engine: dict, g: "_Graphs") -> tuple:
    """Everything the next rollout's replay depends on, copied. (`g.captures` only names the streams
    of a trainer that never clears workspaces, and those names are in `g.streams`.)"""
    return ({lane: Counter(c) for lane, c in lanes.held.items()},
            {lane: Counter(c) for lane, c in lanes.paused.items()}, dict(lanes.peaks), dict(actor),
            dict(engine), (g.captured, g.ever, g.released), {lane: frozenset(s) for lane, s in g.streams.items()})


def _sizes(cfg, cpu_count: int) -> tuple[_Run, dict]:
    mc = model_config(cfg.preset, cfg.digits)
    cuda = cfg.device == "cuda"
    outs = [None, 1] if cfg.use_critic else [None]
    numels = [sum(param_numels(mc, o)) for o in outs]
    host_opt = cfg.optimizer_cpu_offload
    state = Counter(params=4 * sum(numels), gradients=4 * sum(numels))
    state_host = Counter()
    (state_host if host_opt else state)["optimizer"] += 8 * sum(numels)
    if host_opt:
        state_host["optimizer"] += 8 * sum(numels)  # fp32 master weights and their gradient
    if not cuda:  # one memory: the "device" state is host memory too
        state_host.update(state)
        state = Counter()
    saver = cfg.offload_train_backend == TORCH_MEMORY_SAVER
    # the offloader's host copies: every device tensor except params mirrored by a host optimizer
    own_copies = sum(state.values()) - (4 * sum(numels) if host_opt else 0)
    offload_host = (sum(state.values()) if saver else own_copies) if cfg.offload_train_target == "cpu" else 0
    chunk = max(max_chunk_numel(param_numels(mc, o), cfg.chunk_bytes, 4) for o in outs) * 4
    workers = max(4, min(8, cpu_count))  # offload.DiskOffloader's I/O threads
    disk = cfg.offload_train and cfg.offload_train_target == "disk"
    server = cfg.rollout_engine == "server"
    item = 2 if cuda else 4
    per_token = mc.kv_bytes_per_token(item)
    local = cfg.rollout_batch_size // cfg.world_size * cfg.n_samples_per_prompt
    capacity = cfg.kv_cache_bytes // per_token
    batch = min(local, capacity // mc.max_seq_len)
    dev = (TRAINER, "cuda" if cuda else "host")
    run = _Run(
        state=dict(state), state_host=dict(state_host), offload_host=offload_host, disk=disk,
        staging=workers * chunk if disk and cuda else 0,
        update=_update_transients(dev, server, disk, chunk, 4 * max(param_numels(mc))),
        engine_weights=item * numels[0], kv=capacity * per_token,
        prefill=10 * batch * (cfg.digits + 2) * mc.d_model * item, decode=10 * batch * mc.d_model * item,
        train=train_activation_bytes(mc, cuda, min(cfg.micro_batch_size, local), outs),
        train_saver=saver, engine_saver=cfg.rollout_memory_backend == TORCH_MEMORY_SAVER,
        dev=dev, eng=(ENGINE if server else TRAINER, dev[1]))
    assumptions = {"num_params": numels[0], "critic_params": numels[1] if len(numels) > 1 else 0,
                   "rollout_engine": cfg.rollout_engine, "rollout_memory_backend": cfg.rollout_memory_backend,
                   "offload_train_backend": cfg.offload_train_backend, "disk_workers": workers if disk else 0,
                   "chunk_bytes": chunk, "kv_capacity_tokens": capacity, "generate_batch": batch,
                   "cublas_workspace_bytes": CUBLAS_WORKSPACE_BYTES if cuda else 0,
                   "cuda_graph": bool(cuda and cfg.cuda_graph)}
    return run, assumptions


def _update_transients(dev: tuple[str, str], server: bool, disk: bool, chunk: int,
                       largest_param: int) -> dict[tuple[str, str], int]:
    """What one weight update adds while the actor's state is offloaded. In process on CUDA: each host
    parameter is staged on the device in fp32 before the bf16 cast. To a server: the client's chunk
    buffer (device, or shared host memory on CPU), whatever the state's place. CPU and disk: the
    chunk read back from its file."""
    if server:
        return {dev: chunk}
    if dev[1] == "cuda":
        return {dev: largest_param}
    return {dev: chunk} if disk else {}


class _Graphs:
    """Decode graphs, and the cuBLAS workspaces the matmuls leave: one per (thread, stream) that ran
    one, kept by cuBLAS until the engine's release clears them all (`memory_backend.settle`; a trainer
    from before that, `clears_workspaces=False`, kept each and one more per graph captured again)."""

    def __init__(self, enabled: bool, clears: bool):
        self.enabled, self.clears = enabled, clears
        self.captured = self.ever = self.released = False
        self.streams: dict[tuple[str, str], set[str]] = {}
        self.captures = 0

    def use(self, lanes: _Lanes, lane: tuple[str, str], *streams: str) -> None:
        if lane[1] != "cuda":
            return
        held = self.streams.setdefault(lane, set())
        for stream in streams:
            if stream not in held:
                held.add(stream)
                lanes.add(lane, "workspace", CUBLAS_WORKSPACE_BYTES)

    def clear(self, lanes: _Lanes, lane: tuple[str, str]) -> None:
        if self.clears and self.streams.get(lane):
            lanes.free(lane, "workspace", len(self.streams[lane]) * CUBLAS_WORKSPACE_BYTES)
            self.streams[lane] = set()

    def capture(self, lanes: _Lanes, run: _Run) -> None:
        lanes.snapshot({run.eng: {"generation": run.decode}})  # the warm-up's eager decode step
        self.captures += 1
        self.use(lanes, run.eng, "warmup", "capture" if self.clears else f"capture{self.captures}")
        self.captured = self.ever = True


def _generate(lanes: _Lanes, run: _Run, engine: dict, g: _Graphs) -> None:
    lanes.begin(GENERATE)
    if g.enabled and not g.captured and not g.released:
        g.capture(lanes, run)
    g.use(lanes, run.eng, "main")  # the prefill
    lanes.snapshot({run.eng: {"generation": run.prefill}})


def _release(lanes: _Lanes, run: _Run, name: str, tags: tuple[str, ...], engine: dict, g: _Graphs) -> None:
    lanes.begin(name)
    g.captured = False  # builtin and torch_memory_saver's torch hook mode both drop the graphs
    if CUDA_GRAPH in tags:
        g.released = True
    for tag, size in ((WEIGHTS, run.engine_weights), (KV_CACHE, run.kv)):
        if tag in tags and engine[tag]:
            lanes.free(run.eng, tag, size, pause=run.engine_saver)
            engine[tag] = False
    g.clear(lanes, run.eng)


def _resume(lanes: _Lanes, run: _Run, name: str, tags: tuple[str, ...], engine: dict, g: _Graphs) -> None:
    lanes.begin(name)
    if CUDA_GRAPH in tags:
        g.released = False
    for tag, size in ((WEIGHTS, run.engine_weights), (KV_CACHE, run.kv)):
        if tag in tags and not engine[tag]:
            (lanes.resume if run.engine_saver else lanes.add)(run.eng, tag, size)
            engine[tag] = True
    if CUDA_GRAPH in tags and g.enabled and g.ever and engine[WEIGHTS] and engine[KV_CACHE] and not g.captured:
        g.capture(lanes, run)


def _offload_train(lanes: _Lanes, run: _Run, actor: dict) -> None:
    lanes.begin(OFFLOAD_TRAIN)
    if not actor["buffers"]:
        if run.offload_host:
            lanes.add(run.host, "offload_buffers", run.offload_host)
        if run.staging:
            lanes.add(run.host, "staging", run.staging)
        actor["buffers"] = True
    if run.dev[1] == "cuda":
        for cat, b in run.state.items():
            lanes.free(run.dev, cat, b, pause=run.train_saver)
    if run.disk:  # host tensors go to files too
        for cat, b in run.state_host.items():
            lanes.free(run.host, cat, b)
    actor["offloaded"] = True


def _onload_train(lanes: _Lanes, run: _Run, actor: dict) -> None:
    lanes.begin(ONLOAD_TRAIN)
    if actor["offloaded"]:
        if run.dev[1] == "cuda":
            for cat, b in run.state.items():
                (lanes.resume if run.train_saver else lanes.add)(run.dev, cat, b)
        if run.disk:
            for cat, b in run.state_host.items():
                lanes.add(run.host, cat, b)
        actor["offloaded"] = False


def _train(lanes: _Lanes, run: _Run, g: _Graphs) -> None:
    lanes.begin(TRAIN)
    g.use(lanes, run.dev, "main", "autograd")  # the forward, and the backward's own thread
    lanes.snapshot({run.dev: run.train})


def _clear_memory(lanes: _Lanes) -> None:
    lanes.begin(CLEAR_MEMORY)


def _update_weights(lanes: _Lanes, run: _Run, actor: dict) -> None:
    lanes.begin(UPDATE_WEIGHTS)
    # a server always gets its weights through the client's chunk buffer; in process only offloaded
    # state (host buffer, backup, master copy, disk chunk) needs a transient
    if actor["offloaded"] or run.eng[0] == ENGINE:
        lanes.snapshot({lane: {"weight_update": b} for lane, b in run.update.items()})


def _rollout_cpu_peak(lanes, run, cfg, actor, engine, g) -> None:
    _generate(lanes, run, engine, g)
    if cfg.offload_rollout:
        _release(lanes, run, OFFLOAD_ROLLOUT, (*cfg.offload_rollout_tags, CUDA_GRAPH), engine, g)
    if cfg.offload_train:
        _onload_train(lanes, run, actor)
    _train(lanes, run, g)
    if cfg.offload_train:
        _offload_train(lanes, run, actor)
    else:
        _clear_memory(lanes)
    if cfg.offload_rollout and WEIGHTS in cfg.offload_rollout_tags:
        _resume(lanes, run, ONLOAD_WEIGHTS, (WEIGHTS,), engine, g)
    _update_weights(lanes, run, actor)
    if cfg.offload_rollout:
        _resume(lanes, run, ONLOAD_KV, (KV_CACHE, CUDA_GRAPH), engine, g)


def _rollout_gpu_peak(lanes, run, cfg, actor, engine, g) -> None:
    levels = cfg.offload_rollout_tags
    _generate(lanes, run, engine, g)
    if KV_CACHE in levels:
        _release(lanes, run, OFFLOAD_KV, (KV_CACHE, CUDA_GRAPH), engine, g)
    _onload_train(lanes, run, actor)
    if WEIGHTS in levels:
        _release(lanes, run, OFFLOAD_WEIGHTS, (WEIGHTS,), engine, g)
    _train(lanes, run, g)
    _clear_memory(lanes)
    if WEIGHTS in levels:
        _resume(lanes, run, ONLOAD_WEIGHTS, (WEIGHTS,), engine, g)
    _offload_train(lanes, run, actor)
    _update_weights(lanes, run, actor)
    _resume(lanes, run, ONLOAD_KV, (KV_CACHE, CUDA_GRAPH), engine, g)
