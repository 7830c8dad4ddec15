"""Training: whole DDP steps fed by offloaders against stock DDP, on CPU ranks or one accelerator."""
