"""Results files that appear whole or not at all, locally or in an object store.

    with committed(location("s3://bucket/results.parquet")) as f:
        f.write(...)                     # streamed: the store gets it part by part

The file is written beside its target under a hidden temporary name (`.results.parquet.
lowtide-tmp-…`; readers of a folder skip hidden names) and moved onto the target only when
the block ends without an error: locally by a rename, in an object store by the store's own
copy, which a reader sees all at once. A block that fails leaves the previous file as it
was and removes the temporary one (and, in S3, aborts its multipart upload). An object
store's errors become a `LowtideError` naming the URL and the fix (core/locations.py).

An object is uploaded in parts of PART_BYTES, 5 MiB (fsspec's S3 default, 50 MB, is held in
memory and copied again to be sent: 170 MB more at the peak of a big CSV export), doubling
every thousand parts, so S3's 10,000 parts still reach its 5 TB object limit.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lowtide.core.errors import LowtideError
from lowtide.core.locations import Location, store_problem

PART_BYTES = 5 << 20  # an upload's first parts: S3's smallest
PARTS_PER_SIZE = 1000  # the part size doubles after each thousand parts


def temp_name(name: str) -> str:
    return f".{name}.lowtide-tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Turn an object store's errors while writing `url` into ones that name it and the fix."""
    try:
        yield
    except LowtideError:
        raise
    except Exception as err:
        if not _store_error(err):
            raise
        raise LowtideError(store_problem(url, err, "write")) from None


def _store_error(err: BaseException) -> bool:
    return isinstance(err, OSError) or type(err).__module__.split(".")[0] in ("botocore", "aiobotocore", "google", "azure", "gcsfs", "s3fs", "adlfs")


@contextmanager
def committed(loc: Location) -> Iterator[IO[bytes]]:
    """A binary file that becomes `loc` only if the block succeeds (see the module)."""
    if loc.local:
        yield from _local(Path(loc.path))
    else:
        yield from _remote(loc)


def _local(out: Path) -> Iterator[IO[bytes]]:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(temp_name(out.name))
    try:
        with tmp.open("wb") as f:
            yield f
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def _remote(loc: Location) -> Iterator[IO[bytes]]:
    fs = loc.fs
    folder, _, name = loc.path.rpartition("/")
    tmp = f"{folder}/{temp_name(name)}"
    with store_errors(loc.text):
        f = fs.open(tmp, "wb", block_size=PART_BYTES)
    try:
        with store_errors(loc.text):
            yield _Upload(f) if hasattr(f, "parts") else f
            f.close()  # the temporary object is whole now
            fs.mv(tmp, loc.path)
    except BaseException:
        abandon(fs, f, tmp)
        raise


def abandon(fs, f, tmp: str) -> None:
    """Throw away a temporary object: its upload if under way, the object if it was made."""
    if not f.closed:
        discard = getattr(f, "discard", None)
        try:
            if discard is not None:
                discard()  # S3: aborts the multipart upload; nothing is committed
            else:
                f.close()
        except Exception:
            pass
        f.closed = True
    try:
        if fs.exists(tmp):
            fs.rm(tmp)
    except Exception:  # the error that brought us here is the one to report
        pass


class _Upload(io.RawIOBase):
    """A multipart upload (fsspec's S3 file) written through, its part size doubled after each
    PARTS_PER_SIZE parts. Closing it leaves the upload open: `_remote` commits or abandons it."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = self.f.write(data)
        self.f.blocksize = PART_BYTES << min(len(self.f.parts or ()) // PARTS_PER_SIZE, 9)
        return n

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        pass  # nothing to send early: parts go as they fill, the rest when `_remote` closes the file
