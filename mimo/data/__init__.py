"""Floor 2: readers, tokenizers, batching, packing and the per-batch checks."""
