"""Data-parallel flags and launch parsing: the rank from torchrun's environment, the engine's default
per launch, the batch split rule, and `record -- --nproc-per-node N` (pure functions, in process)."""
from __future__ import annotations

import pytest

from miles_profile.errors import MilesProfileError
from miles_profile.record import split_nproc, torchrun_command
from trainer import dist
from trainer.args import parse_args


def test_rank_from_torchrun_env_and_one_process_without_it():
    assert dist.from_env({}) == dist.Rank(0, 0, 1) and not dist.from_env({}).distributed
    assert dist.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}) == dist.Rank(3, 1, 4)
    assert not dist.launched_by_torchrun({}) and dist.launched_by_torchrun({"TORCHELASTIC_RUN_ID": "x"})


def test_engine_is_in_process_alone_and_a_server_under_torchrun(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert parse_args(["--preset", "tiny"], cuda_available=False).rollout_engine == "in_process"
    assert parse_args(["--preset", "tiny", "--rollout-engine", "server"], False).rollout_engine == "server"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = parse_args(["--preset", "tiny"], cuda_available=False)
    assert (cfg.rollout_engine, cfg.world_size) == ("server", 2)
    assert parse_args(["--preset", "tiny", "--rollout-engine", "in_process"], False).rollout_engine == "in_process"


def test_a_batch_that_does_not_split_over_the_ranks_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--preset", "tiny", "--rollout-batch-size", "6"], cuda_available=False, world_size=4)
    assert exc.value.code == 2 and "does not split evenly over 4 ranks" in capsys.readouterr().err
    assert parse_args(["--preset", "tiny", "--rollout-batch-size", "8"], False, world_size=4).world_size == 4


@pytest.mark.parametrize("argv, expected", [
    (["--nproc-per-node", "2", "--preset", "tiny"], (2, ["--preset", "tiny"])),
    (["--nproc-per-node=4"], (4, [])),
    (["--nproc_per_node", "1", "--num-rollout", "3"], (1, ["--num-rollout", "3"])),
    (["--preset", "tiny", "--nproc-per-node", "2"], None),  # only as the first flag: else a trainer flag
])
def test_split_nproc(argv, expected):
    assert split_nproc(argv) == expected


@pytest.mark.parametrize("argv", [["--nproc-per-node"], ["--nproc-per-node", "two"], ["--nproc-per-node=0"]])
def test_split_nproc_rejects(argv):
    with pytest.raises(MilesProfileError) as exc:
        split_nproc(argv)
    assert exc.value.exit_code == 2


def test_torchrun_command_runs_the_trainer_module_standalone():
    command = torchrun_command(2, ["--preset", "tiny"])  # torchrun through trainer.launch (issue 19 item 2)
    assert command[1:] == ["-m", "trainer.launch", "--standalone", "--nproc-per-node", "2",
                           "-m", "trainer.train", "--preset", "tiny"]
