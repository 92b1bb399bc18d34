"""Data: the built-in demo set, tokenizers, batching and the deterministic sample order."""
