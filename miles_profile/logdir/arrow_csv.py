"""pyarrow's CSV reader with malformed rows skipped, and no Python callable ever in pyarrow's thread pool.

pyarrow takes a Python function to skip a malformed row (`invalid_row_handler`). Its threaded reader is
disposed by a pool thread after `read_csv` has returned, and releasing the function there takes the GIL;
when that comes while the interpreter is exiting, Python ends the thread with pthread_exit inside a
noexcept frame and the process aborts ("terminate called without an active exception", SIGABRT) after a
correct result: 7 of 150 `mp.load` children under load (core dump in docs/benchmarks.md, Round 12; the
same backtrace as apache/arrow#34314, open). So a file is read with pyarrow's threads and no handler; only
one that has malformed rows is read again, in this thread, with the handler counting them.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv


def read_csv(source, skipped: list[int], *, read_options: pacsv.ReadOptions | None = None,
             parse_options: pacsv.ParseOptions | None = None,
             convert_options: pacsv.ConvertOptions | None = None) -> pa.Table:
    """`pacsv.read_csv(source, ...)` with each malformed row skipped and its number appended to `skipped`.
    Raises what pyarrow raises for any other damage (a cell that does not convert, bytes not UTF-8)."""
    read_options = read_options or pacsv.ReadOptions()
    parse_options = parse_options or pacsv.ParseOptions()
    try:
        return pacsv.read_csv(source, read_options=read_options, parse_options=parse_options,
                              convert_options=convert_options)
    except pa.ArrowInvalid as exc:
        # "CSV parse error: Expected 3 columns, got 4": a row the handler skips, so again, serially. Any other
        # failure (a cell that does not convert) the handler cannot mend: the caller's, without a second parse.
        if "CSV parse error" not in str(exc):
            raise

    def on_invalid(row) -> str:
        skipped.append(row.number)
        return "skip"

    read_options.use_threads = False
    parse_options.invalid_row_handler = on_invalid
    return pacsv.read_csv(source, read_options=read_options, parse_options=parse_options,
                          convert_options=convert_options)
