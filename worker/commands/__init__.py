"""The `actonce` commands beyond the worker and the dispatcher: status, explain, turns, and what
each opens first."""
