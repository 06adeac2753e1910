"""The passwords an SQLAlchemy URL can hold (a store's --db, a SQL source's `url`, a SQL
output's): one place that knows both forms, for every check and every message.

A password is `user:password@host`, or a query parameter the driver takes as one: libpq (and
so psycopg) reads any connection keyword from the query, `?password=` and `?sslpassword=`
(the client key's passphrase) among them; MySQL drivers take `passwd`, ODBC `PWD`. Keys are
matched whatever their case. A spec holding either form is refused (core/spec.py `sql_url`);
a URL shown in a message or a start line has each masked as `***`.

    holds_password("postgresql://etl@db/w?password=x")   # True
    shown_url("postgresql://etl@db/w?password=x&sslmode=require")
    # 'postgresql://etl@db/w?password=***&sslmode=require'
"""

from __future__ import annotations

from urllib.parse import quote_plus

from sqlalchemy.engine import URL, make_url

# Query keys whose value is a secret (lower case): libpq's `password` and `sslpassword`,
# MySQL drivers' `passwd`, ODBC's `pwd`.
SECRET_KEYS = frozenset({"password", "sslpassword", "passwd", "pwd"})
MASK = "***"


def _url(url: str | URL) -> URL:
    return url if isinstance(url, URL) else make_url(url)


def secret_keys(url: str | URL) -> list[str]:
    """The query keys of `url` that hold a password, as written."""
    return [key for key in _url(url).query if key.lower() in SECRET_KEYS]


def holds_password(url: str | URL) -> bool:
    """Whether `url` holds a password, as `user:password@` or as a query parameter."""
    u = _url(url)
    return bool(u.password) or bool(secret_keys(u))


def shown_url(url: str | URL) -> str:
    """`url` as a message shows it: any password, in either form, masked."""
    try:
        u = _url(url)
    except Exception:  # not a URL SQLAlchemy reads: shown only up to where a secret could start
        return str(url).split("?", 1)[0].rsplit("@", 1)[-1]
    if not u.query:
        return u.render_as_string(hide_password=True)
    pairs = []
    for key, value in u.query.items():  # rendered here: SQLAlchemy would percent-encode the mask
        for one in value if isinstance(value, tuple) else (value,):
            pairs.append(f"{quote_plus(key)}={MASK if key.lower() in SECRET_KEYS else quote_plus(one)}")
    return f"{u.set(query={}).render_as_string(hide_password=True)}?{'&'.join(pairs)}"
