"""`mimo plan`: candidate layouts for N GPUs and their estimated memory per GPU."""
