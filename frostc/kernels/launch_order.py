"""How a kernel may overlap the launch ahead of it in a plan: the contract between the kernels
and `frostc.resolve.mark_early_starts`, which marks such launches `early` (the runtime launches
them with programmatic stream serialization).

An early launch starts once every CTA of the launch ahead has started or executed
griddepcontrol.launch_dependents; its kernel must wait (griddepcontrol.wait: the launch ahead
has finished and its writes are visible) before it reads anything that launch writes. A variant
declares how it waits with an `early_start` attribute; one without it never starts early.
"""

# before its first global read. It may follow a launch whose completion means every launch before
# it has completed too ("settled": one not started early, or one that waited at entry for a settled
# launch): griddepcontrol.wait waits for the launch ahead only, and a paged attention that waits
# only before its new rows may finish before the kv_append ahead of it does. A variant that reads
# nothing earlier launches write but what the launch ahead writes (`reads_only_the_launch_ahead`:
# the combine) may follow any launch.
WAITS_AT_ENTRY = "waits_at_entry"
# only before the cache blocks that hold the step's new rows: it may follow a launch that writes
# nothing but those rows of its caches (a variant with `appends_to_caches`: kv_append) into the
# caches it reads (its variant's `reads_caches` parameters, in the same order)
WAITS_FOR_NEW_ROWS = "waits_for_new_rows"

# Which rows are new: an appending variant names (`new_rows`) the parameters that say which
# positions of each sequence it writes, its waiting follower those of the positions it waits
# before; the follower may start early only if both name the same parameters, bound to the same
# slots (or constants). A follower that names none deems new each sequence's last s_new
# positions of its seq_len_kv (the paged decode attention); kv_append's packed form names
# cu_seqlens_q instead of s_new: sequence b's last cu[b + 1] - cu[b] positions.
NEW_ROWS_BY_S_NEW = ("seq_len_kv", "s_new")
