"""What `record --exec` changes for a Ray job: the hook in the command's environment, and for
`ray job submit` the run's variables in the submission's runtime env (the submitter's environment
reaches nothing there: the entrypoint runs on the head node, as a child of Ray's job supervisor)."""
from __future__ import annotations

import json
import os

from miles_profile.cluster.env import HOOK, HOOK_ENV, worker_env
from miles_profile.cluster.hook import NEXT_HOOK_ENV
from miles_profile.errors import MilesProfileError


def with_hook(env: dict[str, str]) -> dict[str, str]:
    """`env` with our runtime-env hook; one the user set already is kept and called first."""
    env = dict(env)
    previous = env.get(HOOK_ENV)
    if previous and previous != HOOK:
        env[NEXT_HOOK_ENV] = previous
    env[HOOK_ENV] = HOOK
    return env


def is_job_submit(command: list[str]) -> bool:
    return len(command) >= 3 and os.path.basename(command[0]) == "ray" and command[1:3] == ["job", "submit"]


def submit_command(command: list[str], env: dict[str, str]) -> list[str]:
    """`ray job submit ... -- entrypoint` with the run's variables and the hook in its runtime env
    (merged into a `--runtime-env-json` the user gave; their own variables win)."""
    carried = {**worker_env(env), HOOK_ENV: HOOK}
    end = command.index("--") if "--" in command else len(command)
    options, entry = command[:end], command[end:]
    if any(o == "--runtime-env" or o.startswith("--runtime-env=") for o in options):
        raise MilesProfileError("record cannot add the run to a --runtime-env file: pass it as --runtime-env-json",
                                exit_code=2)
    runtime_env: dict = {}
    for i, option in enumerate(options):
        text = None
        if option == "--runtime-env-json" and i + 1 < len(options):
            text = options[i + 1]
        elif option.startswith("--runtime-env-json="):
            text = option.split("=", 1)[1]
        if text is not None:
            try:
                runtime_env = json.loads(text)
            except ValueError:
                raise MilesProfileError(f"--runtime-env-json is not JSON: {text!r}", exit_code=2) from None
            options = options[:i] + options[i + (1 if "=" in option else 2):]
            break
    runtime_env["env_vars"] = {**carried, **(runtime_env.get("env_vars") or {})}
    return [*options, "--runtime-env-json", json.dumps(runtime_env), *entry]
