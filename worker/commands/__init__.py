"""The `actonce` commands beyond the worker and the dispatcher: status, explain, and what each opens
first."""
