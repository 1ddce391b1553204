"""Which errors escaping an attempt are a store gone away: the task retries those alone."""

from celery.exceptions import Retry
from reflexr.workspace import RunFailure
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from actonce.tasks.lifecycle import store_outage_retry_s
from actonce.tasks.outage import is_store_outage


class _DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__("driver error")
        self.sqlstate = sqlstate


def _wrapped(sqlstate: str) -> BaseException:
    """A driver error as SQLAlchemy and reflexr's executor hand it on: wrapped, in a group."""
    return ExceptionGroup(
        "unhandled errors in a TaskGroup", [DBAPIError("SELECT 1", None, _DriverError(sqlstate))]
    )


def test_connection_errors_in_any_wrapping_are_an_outage() -> None:
    assert is_store_outage(ConnectionResetError(104, "reset by peer"))
    assert is_store_outage(FileNotFoundError(2, "no socket"))
    assert is_store_outage(_wrapped("08003"))  # connection does not exist
    assert is_store_outage(_wrapped("57P03"))  # the database system is starting up
    assert is_store_outage(OperationalError("SELECT 1", None, Exception("database is locked")))
    try:
        try:
            raise ConnectionRefusedError(111, "refused")
        except OSError as refused:
            raise RuntimeError("a wrapper") from refused
    except RuntimeError as chained:
        assert is_store_outage(chained)


def test_bugs_refusals_and_retries_are_not() -> None:
    assert not is_store_outage(ValueError("a bug"))
    assert not is_store_outage(RunFailure("refused", reason="forbidden", permanent=True))
    assert not is_store_outage(Retry("retry"))
    assert not is_store_outage(IntegrityError("INSERT", None, _DriverError("23505")))
    assert not is_store_outage(_wrapped("42P01"))  # a missing table is not an outage


def test_the_retries_double_up_to_thirty_seconds() -> None:
    assert [store_outage_retry_s(n) for n in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
