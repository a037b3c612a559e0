"""Planning: sizing the expert scratch and the KV pool offline (`wisp plan`, `wisp sim`)."""
