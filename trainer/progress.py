"""One line per rollout with reward, loss and step time; a tqdm bar instead when tqdm is installed
and stderr is a terminal (the GPU machine has no tqdm, and logs read better as lines)."""
from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int):
        self.total = total
        self._bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm  # only on a terminal: a log or CI never pays for it
                self._bar = tqdm(total=total, unit="rollout", dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, rollout_id: int, reward: float, loss: float, seconds: float) -> None:
        if self._bar is not None:
            self._bar.set_postfix(reward=f"{reward:.3f}", loss=f"{loss:+.3e}", step=f"{seconds:.2f}s")
            self._bar.update(1)
        else:
            print(f"rollout {rollout_id + 1}/{self.total}  reward {reward:.3f}  loss {loss:+.3e}  "
                  f"step {seconds:.2f}s", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
