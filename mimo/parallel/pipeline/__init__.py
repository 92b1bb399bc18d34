"""Pipeline parallelism: stage plans, the model split, stages, microbatches, the 1F1B schedule."""
