"""Flag parsing and the cross-flag rules (trainer/args.py), in process."""
from __future__ import annotations

import argparse

import pytest

from trainer import memory_backend
from trainer.args import build_parser, parse_args, parse_bytes, parse_levels, validate

ALL_OFFLOAD = ["--offload-train", "--offload-rollout", "--optimizer-cpu-offload"]


@pytest.mark.parametrize("values, tags", [
    (["kv_cache", "weight"], ("kv_cache", "weights")),
    (["kv_cache,weight"], ("kv_cache", "weights")),
    (["weight,kv_cache"], ("weights", "kv_cache")),
    (["kv_cache"], ("kv_cache",)),
    (["kv_cache,", "kv_cache"], ("kv_cache",)),
])
def test_levels_accept_spaces_and_commas(values, tags):
    assert parse_levels(values) == tags


@pytest.mark.parametrize("values", [["kv"], ["kv_cache,weights"], [","], ["cuda_graph"]])
def test_unknown_level_is_an_error(values):
    with pytest.raises(ValueError, match="unknown level"):
        parse_levels(values)


@pytest.mark.parametrize("text, nbytes", [("1048576", 1048576), ("64MiB", 64 * 1024**2),
                                          ("12GiB", 12 * 1024**3), ("1.5k", 1536), ("2 gib", 2 * 1024**3)])
def test_parse_bytes(text, nbytes):
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["", "12GB", "-1", "ten"])
def test_parse_bytes_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bytes(text)


def _problem(argv, cuda=False):
    return validate(build_parser().parse_args(argv), cuda_available=cuda)


INVALID = [
    (["--colocate-memory-peak-device", "gpu"], "needs --offload-train and --offload-rollout"),
    (["--colocate-memory-peak-device", "gpu", "--offload-train"], "needs --offload-train and --offload-rollout"),
    (["--colocate-memory-peak-device", "gpu", *ALL_OFFLOAD, "--use-critic"], "does not support --use-critic"),
    (["--offload-rollout-level", "kv_cache"], "needs --offload-rollout"),
    (["--offload-rollout", "--offload-rollout-level", "kv_cache,bogus"], "unknown level"),
    (["--offload-train-target", "disk"], "needs --offload-train"),
    (["--offload-train", "--offload-train-target", "disk"], "needs --offload-train-disk-dir"),
    (["--offload-train-disk-dir", "/tmp/x"], "needs --offload-train-target disk"),
    (["--device", "cuda"], "no CUDA device"),
    (["--cuda-graph"], "needs --device cuda"),
    (["--num-rollout", "0"], "--num-rollout must be at least 1"),
    (["--n-samples-per-prompt", "1"], "at least 2 for GRPO"),
    (["--kv-cache-bytes", "1024"], "holds less than one sequence"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--rollout-memory-backend", "torch_memory_saver"], "torch_memory_saver: needs a CUDA device"),
    (["--offload-train-backend", "torch_memory_saver"], "needs --offload-train"),
    (["--offload-train", "--offload-train-backend", "torch_memory_saver"], "torch_memory_saver: needs a CUDA device"),
    (["--offload-train", "--offload-train-backend", "torch_memory_saver", "--offload-train-target", "disk",
      "--offload-train-disk-dir", "/tmp"], "use it with --offload-train-target cpu"),
]


@pytest.mark.parametrize("argv, message", INVALID)
def test_invalid_combinations(argv, message):
    problem = _problem(argv)
    assert problem is not None and message in problem
    assert "\n" not in problem


@pytest.mark.parametrize("argv", [
    [],
    ALL_OFFLOAD,
    [*ALL_OFFLOAD, "--colocate-memory-peak-device", "gpu", "--offload-rollout-level", "kv_cache", "weight"],
    ["--use-critic", "--n-samples-per-prompt", "1"],
    ["--offload-rollout", "--offload-rollout-level", "weight"],
    ["--no-offload-train", "--no-offload-rollout"],
])
def test_valid_combinations(argv):
    assert _problem(argv) is None


def test_unwritable_disk_dir_is_a_flag_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a directory cannot be made under a regular file, even by root
    problem = _problem(["--offload-train", "--offload-train-target", "disk",
                        "--offload-train-disk-dir", str(blocker / "sub")])
    assert problem is not None and "is not writable" in problem


def test_parse_args_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--colocate-memory-peak-device", "gpu"], cuda_available=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m trainer.train: error:")


def test_argparse_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--offload-train-target", "tape"], cuda_available=False)
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_resolve_fills_preset_defaults(tmp_path):
    cfg = parse_args(["--preset", "tiny", *ALL_OFFLOAD, "--offload-train-target", "disk",
                      "--offload-train-disk-dir", str(tmp_path)], cuda_available=False)
    assert cfg.device == "cpu" and not cfg.cuda_graph
    assert cfg.offload_rollout_tags == ("kv_cache", "weights")
    assert cfg.kv_cache_bytes == cfg.preset.kv_cache_bytes and cfg.digits == cfg.preset.digits
    with pytest.raises(AttributeError):
        cfg.seed = 1  # frozen: nothing mutates the configuration after validation


def test_auto_device_picks_cuda_when_present():
    assert parse_args([], cuda_available=True).device == "cuda"
    assert parse_args([], cuda_available=True).cuda_graph
    assert parse_args(["--device", "auto"], cuda_available=False).device == "cpu"


def test_help_groups_every_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--offload-train", "--no-offload-train", "--offload-rollout", "--no-offload-rollout",
                 "--offload-rollout-level", "--colocate-memory-peak-device", "--offload-train-target",
                 "--offload-train-disk-dir", "--optimizer-cpu-offload", "--use-critic", "--device",
                 "--num-rollout", "--seed", "--preset", "--kv-cache-bytes", "--rollout-memory-backend",
                 "--offload-train-backend"):
        assert flag in out
    for group in ("run:", "rollout:", "train:", "offload and colocation:"):
        assert group in out


def _tms_importable() -> bool:
    return memory_backend.unavailable_reason("cuda") is None


@pytest.mark.skipif(_tms_importable(), reason="torch_memory_saver is installed here")
@pytest.mark.parametrize("flag", [["--rollout-memory-backend", "torch_memory_saver"],
                                  ["--offload-train", "--offload-train-backend", "torch_memory_saver"]])
def test_torch_memory_saver_without_the_package_is_a_flag_error(flag):
    problem = _problem(["--device", "cuda", *flag], cuda=True)
    assert problem is not None and "not importable" in problem and "\n" not in problem


def test_auto_memory_backend_resolves_to_what_can_run():
    assert parse_args([], cuda_available=False).rollout_memory_backend == "builtin"
    expected = "torch_memory_saver" if _tms_importable() else "builtin"
    assert parse_args([], cuda_available=True).rollout_memory_backend == expected
    assert parse_args(["--rollout-memory-backend", "builtin"], cuda_available=True).rollout_memory_backend == "builtin"
    assert parse_args([], cuda_available=True).offload_train_backend == "builtin"
