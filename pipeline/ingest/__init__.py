"""Reading: Parquet shards -> checked documents -> token ids -> packed batches (and the rejects file)."""
