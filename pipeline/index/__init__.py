"""The FAISS index: plan (factory under a memory budget), build, tune, files, search, GPU."""
