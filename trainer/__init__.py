"""The integrated RL trainer: a small decoder-only policy trained with GRPO (or PPO with a critic) on a
synthetic task, with Miles' colocation and offload strategies applied phase by phase.

Modules, one purpose each: `args` (flags and their rules), `config` (presets), `model` (the
transformer), `task` (prompts and rewards), `algo` (advantages and losses), `flat` (parameters as views
into one flat buffer), `kv_cache` and `rollout_engine` (generation with an SGLang-like memory API),
`cuda_graphs` (captured decode steps), `disk_store` and `offload` (where training state goes),
`actor` (the trained networks and their optimizers), `dist` (data-parallel ranks under torchrun),
`engine_http`, `engine_server` and `engine_client` (the engine in its own process behind SGLang-style
HTTP), `progress`, and `train` (the loop).
"""
