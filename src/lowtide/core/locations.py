"""Where data lives: a local path, or a URL of an object store read through fsspec.

    loc = location("s3://tickets/2026/", base_dir)   # or "data/*.csv", "hf://datasets/…"
    loc.files()                                      # the files it names, sorted: a file, a folder's, a glob's
    with loc.open_text(path) as f: ...

Credentials come from each store's own chain (environment, profile, instance role, the
emulator variables the SDKs read): a spec names a place, never a key. Every failure is a
`SourceError` naming the URL and the fix: an extra not installed, no credentials, an unknown
bucket, access denied, nothing there.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lowtide.core.errors import SourceError

# scheme -> the extra that brings its fsspec filesystem
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure", "hf": "hf"}
BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}  # the path's first part is a bucket (container)
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://")
BLOCK = 8 << 20  # bytes fetched per read from an object store
_GLOB = re.compile(r"[*?\[]")


def scheme_of(text: str) -> str | None:
    """The URL scheme of `text`, or None for a local path (a `file://` URL is local too)."""
    m = _URL.match(text)
    if m is None or m.group(1).lower() == "file":
        return None
    return m.group(1).lower()


def is_hidden(name: str) -> bool:
    """Files a dataset's writers leave beside its data: `_SUCCESS`, `.crc`, `_metadata`."""
    return name.startswith((".", "_"))


@dataclass
class Location:
    text: str  # as the spec gives it (a local path resolved against the spec's folder)
    fs: Any  # an fsspec filesystem
    path: str  # the path within `fs`
    local: bool
    _files: list[str] | None = field(default=None, repr=False)

    @property
    def is_glob(self) -> bool:
        return bool(_GLOB.search(self.path))

    @property
    def bucket(self) -> str | None:
        """The bucket (Azure: container) the location is in, for a store that has them."""
        return self.path.split("/", 1)[0] if scheme_of(self.text) in BUCKETED else None

    @property
    def base(self) -> str:
        """The folder partition directories are read below: the location itself for a
        folder, the part before the first wildcard for a glob."""
        if self.is_glob:
            head = self.path[: _GLOB.search(self.path).start()]
            return head.rsplit("/", 1)[0] if "/" in head else ""
        return self.path

    def name_of(self, path: str) -> str:
        """A file's name for messages: relative to the location where it is inside it."""
        base = self.base.rstrip("/")
        return path[len(base) + 1 :] if base and path.startswith(base + "/") else path.rsplit("/", 1)[-1]

    def files(self) -> list[str]:
        """The data files the location names, sorted; refused when there are none."""
        if self._files is None:
            self._files = self._list()
        return self._files

    def _list(self) -> list[str]:
        with self.errors():
            if self.is_glob:
                # with details: one listing, not a request per match to ask whether it is a file
                matched = self.fs.glob(self.path, detail=True)
                found = sorted(p for p, info in matched.items() if info.get("type") == "file" and not is_hidden(p.rstrip("/").rsplit("/", 1)[-1]))
                if not found:
                    self._check_bucket()
                    raise SourceError(f"{self.text}: no file matches; check the pattern in `source.path`")
                return found
            if self.fs.isdir(self.path):
                top = self.path.rstrip("/")
                # a key ending in "/" is the marker an object store's "create folder" leaves
                found = sorted(p for p in self.fs.find(self.path) if not p.endswith("/") and not any(is_hidden(part) for part in p[len(top) :].split("/")))
                if not found:
                    raise SourceError(f"{self.text}: an empty folder; put the data files in it, or point `source.path` at the right one")
                return found
            if not self.fs.exists(self.path):
                self._check_bucket()
                raise SourceError(f"{self.text}: no such file; check `source.path`{'' if not self.local else ' (relative to the spec file)'}")
            return [self.path]

    def _check_bucket(self) -> None:
        """Nothing at the path: say so of the bucket where it is the bucket that is missing."""
        bucket = self.bucket
        if bucket and not self.fs.exists(bucket):
            raise SourceError(f"{self.text}: no such bucket ({bucket}); check the bucket's name in the URL")

    @property
    def one_file(self) -> bool:
        return not self.is_glob and len(self.files()) == 1 and self.files()[0].rstrip("/") == self.path.rstrip("/")

    @contextmanager
    def open_text(self, path: str, newline: str | None = None) -> Iterator[IO[str]]:
        # a small read-ahead block: fsspec's default (S3: 50 MB) is fetched whole to read a header
        with self.errors(), self.fs.open(path, "rb", block_size=BLOCK) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline) as f:
            yield f

    def open_bytes(self, path: str):
        with self.errors():
            return self.fs.open(path, "rb")

    def arrow_filesystem(self):
        """The location's filesystem as pyarrow's datasets take it."""
        import pyarrow.fs as pafs

        if self.local:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Turn a store's errors into ones that name the URL and the fix."""
        try:
            yield
        except (SourceError, UnicodeDecodeError):  # a reader's own problem: it says where
            raise
        except Exception as err:
            raise SourceError(store_problem(self.text, err)) from None


def location(text: str, base_dir: str | Path = ".") -> Location:
    """The place `text` names: a URL through its fsspec filesystem, else a local path
    (relative to `base_dir`, the spec's folder)."""
    scheme = scheme_of(text)
    if scheme is None:
        from fsspec.implementations.local import LocalFileSystem

        raw = text[len("file://") :] if text.lower().startswith("file://") else text
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else Path(base_dir) / p
        return Location(str(p), LocalFileSystem(), p.absolute().as_posix(), local=True)
    if "@" in text.split("://", 1)[1].split("/", 1)[0] and ":" in text.split("://", 1)[1].split("@", 1)[0]:
        raise SourceError(f"{redact(text)}: a URL with a key in it; remove it, and give the key the store's own way (environment, profile, role)")
    try:
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(text)
    except (ImportError, ValueError) as err:
        extra = EXTRAS.get(scheme)
        if extra is not None:
            raise SourceError(f"{text}: reading {scheme}:// needs its filesystem; install it with pip install 'lowtide[{extra}]'") from None
        raise SourceError(f"{text}: unknown URL scheme {scheme}:// ({err}); use a local path, s3://, gs://, az://, abfs://, hf:// or https://") from None
    return Location(text, fs, path, local=False)


def redact(text: str) -> str:
    """`text` with any user:password in its URL replaced by ***."""
    return re.sub(r"(://)[^/@]*:[^/@]*@", r"\1***@", text)


def store_problem(url: str, err: BaseException, action: str = "read") -> str:
    """What went wrong reaching `url`, in words, with the fix; `action`: "read" or "write"."""
    name = type(err).__name__
    text = redact(str(err))
    if name in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "ClientAuthenticationError", "CredentialUnavailableError") or "credentials" in text.lower() and "unable to locate" in text.lower():
        return (f"{url}: no credentials for this store ({name}); give them the store's own way (for S3: AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile or an instance role; for GCS: GOOGLE_APPLICATION_CREDENTIALS), never in the spec")  # fmt: skip
    if isinstance(err, PermissionError) or "AccessDenied" in text or "403" in text and "Forbidden" in text:
        return f"{url}: access denied ({text}); grant the credentials in use {action} access to it, or use others"
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower() or "specified bucket does not exist" in text.lower():
        return f"{url}: no such bucket; check the bucket's name in the URL"
    if isinstance(err, FileNotFoundError):
        return f"{url}: not found ({text}); check the path"
    if isinstance(err, OSError) and err.strerror:
        return f"{url}: cannot {action} ({err.strerror})"
    return f"{url}: cannot {action} ({name}: {text})"

