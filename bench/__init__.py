"""actonce's figures: a side-by-side benchmark (`python -m bench.bench`) and a fault-injection
harness (`python -m bench.chaos`) that proves every write lands once under faults."""
