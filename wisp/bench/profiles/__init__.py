"""`wisp bench profile`: where an engine step's time goes: the kernels (or the host's Python) of profiled steps
(`steps`), and a split decode step's timeline read from such a profile's Chrome trace (`timeline`)."""
