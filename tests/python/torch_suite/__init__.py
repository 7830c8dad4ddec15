"""PyTorch's own distributed tests (shipped in the wheel) driven against dlop and Gloo."""
