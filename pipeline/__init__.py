"""petal's indexing pipeline: Parquet shards -> tokens -> packed batches -> engine -> store -> FAISS."""
