"""The observers of the attempt lifecycle: what each settled outcome is told to."""
