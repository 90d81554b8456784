"""python -m dashboards: a user mistake is one line and exit code 2, never a traceback."""
from __future__ import annotations

import socket

import pytest

from dashboards.__main__ import DEFAULT_HOST, DEFAULT_PORT, build_parser, main


def test_defaults_are_local():
    args = build_parser().parse_args(["/tmp/memory_logs"])
    assert (args.host, args.port) == (DEFAULT_HOST, DEFAULT_PORT) == ("127.0.0.1", 8050)


def test_a_missing_directory_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dashboards: ") and "not a directory" in err and err.count("\n") == 1


def test_a_taken_port_is_one_line_and_exit_2(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([str(tmp_path), "--port", str(port)]) == 2
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_an_impossible_port_is_refused(tmp_path, capsys, port):
    assert main([str(tmp_path), "--port", port]) == 2
