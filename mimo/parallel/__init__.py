"""Floor 4: everything that knows about ranks. Only grid.py creates process groups; only bridge/ moves
tensors between module grids."""
