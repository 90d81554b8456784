"""`trainer.train --launcher ray` flags (issue 31, item 6): --nproc-per-node belongs to the launcher, and a
wrong one is one line and exit 2, before Ray starts."""
from __future__ import annotations

from trainer import ray_launch


def test_the_launcher_takes_its_flags_and_leaves_the_trainers():
    argv = ["--launcher", "ray", "--preset", "tiny", "--nproc-per-node", "3", "--offload-train"]
    assert ray_launch.split_launcher_args(argv) == (3, ["--preset", "tiny", "--offload-train"])
    assert ray_launch.split_launcher_args(["--launcher", "ray"]) == (1, [])
    assert ray_launch.without_nproc(argv) == ["--launcher", "ray", "--preset", "tiny", "--offload-train"]
    assert ray_launch.without_nproc(["--nproc-per-node", "2"]) == ["--nproc-per-node", "2"]  # not ray: the parser says


def test_a_wrong_rank_count_is_one_line_and_exit_2(capsys):
    assert ray_launch.main(["--launcher", "ray", "--nproc-per-node", "0", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err == "trainer: error: --nproc-per-node must be a positive integer, got '0'\n"
