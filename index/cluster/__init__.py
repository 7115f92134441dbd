"""A sharded index on Ray: the ingress (:mod:`.shards`, fan-out, merge, all-or-nothing writes in
:mod:`.shardwrites`), the shard actor (:mod:`.shardserver`), item placement
(:mod:`.partitioning`), near-duplicate jobs over the shards (:mod:`.shardjobs`,
:mod:`.shardtasks`) and the Ray session that owns the actors (:mod:`.raysession`)."""
