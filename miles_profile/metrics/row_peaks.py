"""The per-phase peaks of the rows every process of a host appended since the previous scrape, folded
for all of them at once by pyarrow's CSV reader: no Python object a cell.

At a 15 s scrape interval 64 processes append 9,600 rows; splitting each into its cells (bytes objects)
and converting two columns cost about 0.9 us a row on the development VM, most of a scrape's reading
(docs/prometheus.md, Cost). Here the new rows of the processes whose rows share a layout are joined and
parsed as one CSV (only the phase and the two peak columns converted, on the scraping thread alone),
the runs of one phase within one process found from the phase column's dictionary indices, and each
run's maxima taken with numpy's `maximum.reduceat`: about 2.4 ms for 9,600 rows, 0.6 ms for 640. The
rows' times come back too: the judging of an offload looks up the row before it began (a bisection).

Anything pyarrow does not read as Python's int() reads it (an empty cell, a number past int64, a row
with another number of cells) gives None for the whole batch: the caller folds each process's rows
itself then, row by row where it must (process_state.py). Cells are taken as written: no quoting, no
escapes, as the recorder writes them (logdir/writer.py).
"""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

TIME_COL, PHASE_COL = 0, 1  # a samples row is t, phase, then the columns (logdir/writer.py)
_PARSE = pa_csv.ParseOptions(quote_char=False, escape_char=False, newlines_in_values=False,
                             ignore_empty_lines=False)


def fold(chunks: list[bytes], width: int, columns: tuple[int | None, int | None]
         ) -> list[tuple[list[tuple[bytes, int, int]], list[float]]] | None:
    """For each chunk (one process's new rows, whole lines of `width` cells each): its runs of one
    phase in order, (phase cell, the largest value of columns[0] in the run, of columns[1]; -1 for a
    column that is None), and its rows' times. None when any row does not read (see the module's
    docstring)."""
    counts = [chunk.count(b"\n") for chunk in chunks]
    rows = sum(counts)
    if rows == 0:
        return None
    names = [f"c{k}" for k in range(width)]
    wanted = {TIME_COL: pa.float64(), PHASE_COL: pa.binary(), **{col: pa.int64() for col in columns if col is not None}}
    try:
        table = pa_csv.read_csv(
            io.BytesIO(b"".join(chunks)),
            read_options=pa_csv.ReadOptions(column_names=names, use_threads=False, block_size=1 << 26),
            parse_options=_PARSE,
            convert_options=pa_csv.ConvertOptions(column_types={names[c]: t for c, t in wanted.items()},
                                                  include_columns=[names[c] for c in sorted(wanted)],
                                                  strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowException, ValueError):  # a torn row, a cell that is no int64
        return None
    if table.num_rows != rows:
        return None
    times = table.column(names[TIME_COL])
    if times.null_count:
        return None
    times = times.to_numpy().tolist()
    values = []
    for col in columns:
        if col is None:
            values.append(np.full(rows, -1, dtype=np.int64))
            continue
        column = table.column(names[col])
        if column.null_count:  # an empty cell: the row-by-row fold falls back to the level
            return None
        values.append(column.to_numpy())
    phases = table.column(names[PHASE_COL]).combine_chunks().dictionary_encode()
    index = phases.indices.to_numpy()
    # Where a run of one phase begins: a process's first row, or a phase unlike the previous row's.
    begins = np.zeros(rows, dtype=bool)
    begins[1:] = index[1:] != index[:-1]
    firsts = np.cumsum([0, *counts])
    begins[firsts[:-1][firsts[:-1] < rows]] = True
    runs = np.flatnonzero(begins)
    names_of = phases.dictionary.to_pylist()
    folded = [(names_of[i], a, b) for i, a, b in zip(index[runs].tolist(), np.maximum.reduceat(values[0], runs).tolist(),
                                                     np.maximum.reduceat(values[1], runs).tolist())]
    # The runs of each chunk: those beginning at or after its first row and before the next chunk's.
    bounds = np.searchsorted(runs, firsts).tolist()
    firsts = firsts.tolist()
    return [(folded[lo:hi], times[first:end])
            for lo, hi, first, end in zip(bounds[:-1], bounds[1:], firsts[:-1], firsts[1:])]
