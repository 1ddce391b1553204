"""Showing a store's or broker's URL to people: never with its password."""

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError


def masked(url: str) -> str:
    """Return a URL as it may be shown in a message or a log line: its password as `***`.

    A URL SQLAlchemy cannot parse is shown as `<unparsable URL>`, since where its password would
    start is unknown.
    """
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable URL>"
