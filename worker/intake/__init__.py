"""The intake: the check every message of actonce's queues passes before Celery reads it."""
