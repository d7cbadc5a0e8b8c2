"""Reading files: bounded, never blocking, never following a file into a device or FIFO."""
from __future__ import annotations

import os
import posixpath
import re
import stat
from typing import Callable, Optional

from .limits import MAX_FILE_BYTES, CannotPredict

_NL = b"\n"
ReadFile = Callable[[str], bytes]


def default_read_file(path: str) -> bytes:
    """Read a regular file of at most MAX_FILE_BYTES; OSError otherwise.

    O_NONBLOCK keeps a FIFO from blocking the open; fstat refuses anything but a regular file.
    Symlink loops surface as OSError(ELOOP) from open().
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise OSError(f"larger than {MAX_FILE_BYTES >> 20} MiB")
        chunks = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > MAX_FILE_BYTES:
            raise OSError(f"larger than {MAX_FILE_BYTES >> 20} MiB")
        return data
    finally:
        os.close(fd)


def os_reason(exc: BaseException) -> str:
    """A short reason for a failed read that never includes file contents."""
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory"
    if isinstance(exc, OSError):
        if exc.strerror:
            return exc.strerror.lower()
        if exc.args:
            return str(exc.args[0])[:120]
    return type(exc).__name__


def decode_text(data: bytes, label: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """Bytes -> text, or CannotPredict for binary data or oversize files."""
    if len(data) > max_bytes:
        raise CannotPredict(f"{label} is larger than {max_bytes >> 10} KiB", f"{label}:1")
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise CannotPredict(f"{label} is not a text file (NUL byte)", f"{label}:{line}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[: exc.start]
        # A few stray Latin-1 bytes in a comment are common; mostly-garbage is not a script.
        text = data.decode("utf-8", errors="replace")
        if text.count("\ufffd") * 20 > max(len(text), 1):
            raise CannotPredict(f"{label} is not a text file (invalid UTF-8)",
                                f"{label}:{bad.count(_NL) + 1}") from None
        return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (``\\udcff`` from a JSON escape: no file can hold them) as
    U+FFFD, as the bytes they stood for read back from a file; YAML, TOML and UTF-8 encoders
    refuse them."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")    # fails exactly on a lone surrogate; faster than the regex below
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def join_path(cwd: Optional[str], path: str) -> str:
    if posixpath.isabs(path) or not cwd:
        return posixpath.normpath(path) if path else path
    return posixpath.normpath(posixpath.join(cwd, path))
