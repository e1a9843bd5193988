"""petal's indexing pipeline: Parquet shards -> tokens -> packed batches -> engine -> store -> FAISS."""

__version__ = "0.1.0"
