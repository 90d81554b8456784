"""Tag a Python child of `record --exec` with no edit to its code.

`record --exec` puts the `site/` directory beside this file first on the child's PYTHONPATH (unless
`--no-auto-tag`); Python imports its `sitecustomize.py` at start-up, which calls `install()`. That
only adds an import hook; nothing is imported or started until the program imports, itself:

- `transformers.trainer`: `Trainer.__init__` adds `hf.MilesProfileCallback` (TRL's trainers included);
- `lightning.pytorch` / `pytorch_lightning`'s Trainer: `__init__` appends the Lightning callback;
- `torch.optim.optimizer`: torch's global optimizer step hook (optimizer_steps.py) tags any other loop,
  e.g. one under `accelerate launch`, and steps aside once a callback sees a step.

The environment (PYTHONPATH, MILES_PROFILE_RUN_DIR) passes through `accelerate launch` and `torchrun`
to every rank, and each rank records itself (its rank from torchrun's RANK/LOCAL_RANK). A version
we do not know, or anything failing here, is one line on stderr and the process runs without the
callback: torch's optimizer step hook tags its optimizer steps where it sees them, else the report judges
it by time; the user's training never sees an error from us.

Every Python process of the command imports this file at start-up, so it imports only the standard
library there (sitecustomize loads it by path, without the miles_profile package: 0.25 s a process
otherwise); miles_profile itself is imported when a watched module is.
"""
from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from pathlib import Path

AUTOTAG_ENV = "MILES_PROFILE_AUTOTAG"   # "0": record --exec --no-auto-tag
ROOT_ENV = "MILES_PROFILE_ROOT"         # where miles_profile lives, for a child Python that lacks it
SITE_DIR = Path(__file__).resolve().parent / "site"

# Major versions whose hooks we know (checked against transformers 5.25, trl 1.16, lightning 2.6).
KNOWN = {"transformers": (4, 5), "trl": (0, 1), "lightning": (2,), "pytorch_lightning": (1, 2)}

HF_TRAINER = "transformers.trainer"
LIGHTNING_TRAINERS = {"lightning.pytorch.trainer.trainer": "lightning.pytorch",
                      "pytorch_lightning.trainer.trainer": "pytorch_lightning"}
TORCH_OPTIMIZER = "torch.optim.optimizer"


def child_env(env: dict[str, str], enabled: bool = True) -> dict[str, str]:
    """`env` for a child of `record --exec`: our site directory first on PYTHONPATH, or the flag that turns it off."""
    env = dict(env)
    if not enabled:
        env[AUTOTAG_ENV] = "0"
        return env
    env[AUTOTAG_ENV] = "1"
    env[ROOT_ENV] = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *paths])
    return env


def steps():
    """miles_profile.integrations.steps, imported on first need (from the checkout in ROOT_ENV when this
    Python lacks miles_profile)."""
    try:
        from miles_profile.integrations import steps as module
    except ImportError:
        sys.path.append(os.environ.get(ROOT_ENV, ""))
        from miles_profile.integrations import steps as module
    return module


def warn_once(what: str, text: str) -> None:
    try:
        steps().warn_once(what, text)
    except Exception:  # noqa: BLE001 -- not even miles_profile: say it, once per kind
        print(f"miles_profile: warning: {text}", file=sys.stderr, flush=True)


def known_version(package: str) -> bool:
    """Whether `package`'s installed major version is one we know; one line on stderr when not."""
    module = sys.modules.get(package)
    version = getattr(module, "__version__", "") if module else ""
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        major = -1
    if major in KNOWN.get(package, ()):
        return True
    # No callback then; torch's optimizer step hook (a public torch API, whatever the trainer's version) still
    # tags the optimizer steps it sees, and a process it never sees stays untagged and is judged by time.
    warn_once(package, f"{package} {version or '(version unknown)'} is a version miles_profile does not know: "
                             "no callback; its optimizer steps are tagged by torch's optimizer step hook where "
                             "it sees them, else the report judges this process by time")
    return False


def patch_init(cls: type, after) -> None:
    """Make `cls.__init__` call `after(self)` once it returned (an error in `after` is one warning)."""
    original = cls.__init__
    if getattr(original, "_miles_profile_patched", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            after(self)
        except Exception as exc:  # noqa: BLE001
            warn_once(f"attach {cls.__name__}", f"could not attach to {type(self).__name__}: {exc}; "
                                                      "its steps are not tagged by a callback")
    __init__._miles_profile_patched = True
    cls.__init__ = __init__


def attach_hf(trainer) -> None:
    if type(trainer).__module__.split(".")[0] == "trl" and not known_version("trl"):
        return
    from miles_profile.integrations.hf import MilesProfileCallback
    if not any(isinstance(cb, MilesProfileCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(MilesProfileCallback(trainer))


def patch_transformers(module) -> None:
    if known_version("transformers"):
        patch_init(module.Trainer, attach_hf)


def patch_lightning(module, package: str) -> None:
    def attach(trainer) -> None:
        # Checked and built here, not at import: `lightning.pytorch` is still half-imported when its
        # trainer module has run (no `Callback`, no `__version__` yet).
        if not known_version(package.split(".")[0]):
            return
        from miles_profile.integrations.lightning import callback_class, lightning_callback
        if not any(isinstance(cb, callback_class(package)) for cb in trainer.callbacks):
            trainer.callbacks.append(lightning_callback(package))
    patch_init(module.Trainer, attach)


def patch_torch(module) -> None:
    from miles_profile.integrations import optimizer_steps
    optimizer_steps.install()


def patch(name: str, module) -> None:
    try:
        steps()  # miles_profile importable from here on
        if name == HF_TRAINER:
            patch_transformers(module)
        elif name in LIGHTNING_TRAINERS:
            patch_lightning(module, LIGHTNING_TRAINERS[name])
        elif name == TORCH_OPTIMIZER:
            patch_torch(module)
    except Exception as exc:  # noqa: BLE001 -- never an error in the user's training
        warn_once(name, f"could not hook {name}: {type(exc).__name__}: {exc}; its steps are not tagged")


WATCHED = (HF_TRAINER, *LIGHTNING_TRAINERS, TORCH_OPTIMIZER)


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, lets the other finders find it and has its loader call
    `patch` once the module has run. The loader object stays the module's own (`__loader__` unchanged)."""

    def find_spec(self, name, path, target=None):
        if name not in WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            patch(name, module)
        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Hook the watched modules: those already imported now, the others when the program imports them."""
    if any(isinstance(f, AfterImport) for f in sys.meta_path):
        return
    for name in WATCHED:
        if name in sys.modules:
            patch(name, sys.modules[name])
    sys.meta_path.insert(0, AfterImport())
