"""Layers shared by every model architecture: attention, norms, activations, rotary, pooling."""
