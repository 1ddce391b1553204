"""Every Celery event a pool publishes, as a Flower or `celery events` would receive it."""

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from celery import Celery

from actonce.worker.settings import Settings


@contextlib.contextmanager
def celery_events(settings: Settings, sink: list[dict[str, Any]]) -> Iterator[None]:
    """Receive every Celery event of the pool's broker into `sink`, in a thread."""
    from actonce.worker.app import make_celery

    celery: Celery = make_celery(settings)
    stop = threading.Event()
    ready = threading.Event()

    def receive() -> None:
        with celery.connection_for_read() as connection:
            receiver = celery.events.Receiver(connection, handlers={"*": sink.append})
            ready.set()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError, socket.timeout):
                    receiver.capture(limit=None, timeout=0.5, wakeup=False)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    assert ready.wait(10), "the event receiver did not connect"
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        celery.close()
