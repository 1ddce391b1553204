"""Storage views over reflexr's and relayr's SQL stores: what the pool reads and writes, and how."""
