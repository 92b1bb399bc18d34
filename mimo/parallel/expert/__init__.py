"""Expert parallelism: an MoE layer's experts spread over ranks, tokens sent to them by all-to-all."""
