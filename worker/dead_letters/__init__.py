"""Dead letters: the record of each job the pool gave up on, its store, its commands and its
sweep."""
