"""The demo application: rules whose runs make every kind of write, for `make run` and tests."""
