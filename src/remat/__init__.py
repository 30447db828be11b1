"""remat: fit a PyTorch training step into a memory budget by rematerialization."""
