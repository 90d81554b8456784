"""logdir/line_tail.py: what a live view reads of a growing log (whole lines, once each), on real files."""
from __future__ import annotations

import os

from miles_profile.logdir.line_tail import LineTail, read_regular


def test_whole_lines_once_and_the_latest_window(tmp_path):
    path = tmp_path / "x.csv"
    tail = LineTail(path, limit=1024)
    assert tail.read() == b""  # not there yet: looked for again at the next read
    with open(path, "ab") as f:
        f.write(b"t,a\n1,10\n2,2")  # the last line is still being written
        f.flush()
        assert tail.read() == b"t,a\n1,10\n"
        f.write(b"0\n")
        f.flush()
        assert tail.read() == b"2,20\n"
        assert tail.read() == b""
        f.write(b"".join(b"%d,%d\n" % (k, k) for k in range(3, 1000)))
        f.flush()
        # Only the newest rows within 64 bytes: the cut line at the window's start is dropped, nothing re-read.
        window = tail.read(last=64)
        assert window.endswith(b"999,999\n") and len(window) < 64 and window.startswith(b"99")
        assert window.splitlines()[0] in (b"%d,%d" % (k, k) for k in range(990, 999))
        f.write(b"1000,1000\n")
        f.flush()
        assert tail.read(last=64) == b"1000,1000\n"
    tail.close()


def test_a_line_longer_than_a_read_is_damage_skipped_once(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"x" * 100 + b"\n1,2\n")
    tail = LineTail(path, limit=64)
    assert tail.read() == b""  # 64 bytes, no newline: dropped, not read again at every look
    assert tail.read() == b"x" * 36 + b"\n1,2\n"  # the rest of that line reads as one malformed line
    assert tail.read() == b""


def test_a_fifo_or_a_link_reads_as_nothing_and_never_blocks(tmp_path):
    fifo, link = tmp_path / "fifo.csv", tmp_path / "link.csv"
    os.mkfifo(fifo)
    (tmp_path / "real.csv").write_bytes(b"1\n")
    link.symlink_to(tmp_path / "real.csv")
    for path in (fifo, link):
        assert LineTail(path, limit=64).read() == b"" and read_regular(path, 0, 64) == b""
    assert read_regular(tmp_path / "real.csv", 0, 64) == b"1\n"
