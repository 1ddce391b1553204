"""Dispatching: evaluating rules, polling due runs, and sending one attempt message per due run."""
