"""Process machinery: the torchrun launch and the ranks of a data-parallel run."""
