"""``EXECUTOR_STORE_URL``: what libpq takes (a URL or key=value pairs, one host or several),
and several hosts only with ``target_session_attrs=read-write`` (``state/pgstore.py``)."""

from __future__ import annotations

import pytest

from agentsafe.executor.errors import ConfigError
from agentsafe.executor.state.pgconn import check_store_url


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://agentsafe@db/agentsafe",
        "postgres://agentsafe@db:5432/agentsafe?sslmode=verify-full",
        "postgresql://agentsafe@db-1:5432,db-2:5432/agentsafe?target_session_attrs=read-write",
        "host=db-1,db-2 port=5432,5432 dbname=agentsafe user=agentsafe"
        " target_session_attrs=read-write",
        "host=db-1,db-2 dbname=agentsafe target_session_attrs=primary",
        "host=db dbname=agentsafe user=agentsafe sslmode=verify-full",
    ],
)
def test_a_connection_string_libpq_takes_is_accepted_as_given(url: str) -> None:
    assert check_store_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://agentsafe@db-1:5432,db-2:5432/agentsafe",
        "host=db-1,db-2 dbname=agentsafe",
        "host=db-1,db-2 dbname=agentsafe target_session_attrs=any",
        "hostaddr=10.0.0.1,10.0.0.2 dbname=agentsafe target_session_attrs=read-only",
    ],
)
def test_several_hosts_without_read_write_are_refused(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_store_url(url)
    assert err.value.variable == "EXECUTOR_STORE_URL"
    assert "target_session_attrs=read-write" in err.value.problem
    assert "db-1" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "mysql://agentsafe@db/agentsafe",
        "not a connection string",
        "host='unterminated",
        "postgresql://agentsafe@db/agentsafe?no_such_option=1",
        "postgresql://agentsafe:s3cret@db/agentsafe\nx",
        "",
    ],
)
def test_anything_else_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_store_url(url)
    assert err.value.variable == "EXECUTOR_STORE_URL"
    assert "s3cret" not in str(err.value)
    assert "unterminated" not in str(err.value)
