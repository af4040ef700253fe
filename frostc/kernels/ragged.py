"""Ragged tensor maps: one TMA tensor map over sequences of any lengths and starts, rows past a
sequence's end zero-filled by the TMA unit (the variable-length and paged kernels)."""

# A sequence of `length` rows starting at row `start`
# is addressed with coordinates (RAGGED_ROWS - length + r, ..., RAGGED_ROWS, start + length)
# over modes of strides (row, ..., RAGGED_WRAP - row, row): the address is
#   base + (RAGGED_ROWS - length + r)·row + RAGGED_ROWS·(RAGGED_WRAP - row) + (start + length)·row
#   = base + (start + r)·row + RAGGED_ROWS·RAGGED_WRAP        ≡ base + (start + r)·row
# because RAGGED_ROWS·RAGGED_WRAP·(element bytes) is a multiple of 2**64 and addresses wrap.
# Row r is in bounds exactly when r < length, so the TMA unit zero-fills past the sequence.
RAGGED_ROWS = 1 << 30
RAGGED_WRAP = 1 << 34  # elements
RAGGED_EXTENT = (1 << 31) - 1  # of the two extra modes
