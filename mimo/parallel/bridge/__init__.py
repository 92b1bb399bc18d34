"""Encoder -> LM crossings: colocated (modules share ranks, different DP) and pipelined (disjoint ranks)."""
