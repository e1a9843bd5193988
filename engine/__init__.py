"""petal's encoder engine: packed batches in, pooled embeddings out (CPU or CUDA).

The engine never imports pyarrow, faiss or pipeline code; ``PackedBatch`` is its input contract.
"""
