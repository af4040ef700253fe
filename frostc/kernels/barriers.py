"""The named barriers of frostc's kernels, one enumeration for all of them."""

MAX_CONSUMERS = 3  # the forward kernel's consumer warpgroups, at most (TURN and EPILOGUE take one id each)


class Barrier:
    """Named barrier ids (0 is __syncthreads; sm_90 has 16 per CTA). The kernels' own, in one
    place: an id is free in a kernel that does not use it."""

    DECODE_Q = 1  # the paged decode kernel's Q staging (its consumer warpgroup, 128 threads)
    # ... and, over a quantized cache, the merge of its consumer warps' partial outputs
    DECODE_MERGE = 2

    TURN = 2  # (the forward kernel's; the decode kernel's ids above are free in it)
    # TURN + c: consumer c may issue its GEMMs (it and its predecessor, 256 threads)
    EPILOGUE = TURN + MAX_CONSUMERS  # EPILOGUE + c: consumer c's O staging (128 threads)
    TICKET_FULL = EPILOGUE + MAX_CONSUMERS  # the dynamic walk's next tile is written (`TicketWalk`)
    TICKET_EMPTY = TICKET_FULL + 1  # ... and read by every consumer thread
