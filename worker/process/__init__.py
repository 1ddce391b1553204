"""The process side of a pool member: its runtime, its task host, its health and its exit."""
