"""What the benchmarks share: namespace hosts, forked runs, sizes and JSON, run folders and their packing."""
