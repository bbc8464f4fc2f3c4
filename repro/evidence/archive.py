"""The bundle's archive format: one gzip member around a canonical tar, and reading it safely.

Writing (`tar_chunks`, `gzip_bytes`): members sorted by path, fixed metadata (mode 0644,
uid/gid 0, empty user and group names, no directory entries), a gzip header with mtime 0 and
no file name, so the same files give the same bytes. Reading (`inflate_capped`, `TarView`,
`unsafe_reason`): decompression stops past `MAX_UNCOMPRESSED_BYTES`, the tar is read in
memory without a copy, and every member is judged from its header before its data is read.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib
from collections.abc import Iterator

# gzip header: magic, deflate, no flags, mtime 0, XFL 2 (best compression), OS 255 (unknown).
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
MEMBER_MODE = 0o644
# A bundle is artifacts and logs: far below this. Larger is refused before it fills memory.
MAX_UNCOMPRESSED_BYTES = 2 * 1024**3
CHUNK = 1 << 20


# --- writing ------------------------------------------------------------------------------


def tar_bytes(
    files: dict[str, bytes], mtime: int, executable: frozenset[str] = frozenset()
) -> bytes:
    """The uncompressed tar of ``files`` (path -> bytes): sorted, fixed metadata, no dirs;
    the paths in ``executable`` get mode 0755 (a script), every other file 0644."""
    return b"".join(tar_chunks(files, mtime, executable))


def tar_chunks(
    files: dict[str, bytes], mtime: int, executable: frozenset[str] = frozenset()
) -> Iterator[bytes]:
    """`tar_bytes` piece by piece (header, data, padding, ..., end blocks), as tarfile writes
    them: `repro verify` compares a received tar with this without a second copy in memory."""
    size = 0
    for path in sorted(files):
        data = files[path]
        info = tarfile.TarInfo(path)
        info.size = len(data)
        info.mtime = mtime
        info.mode = 0o755 if path in executable else MEMBER_MODE
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.type = tarfile.REGTYPE
        header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        padding = -len(data) % tarfile.BLOCKSIZE
        yield header
        yield data
        yield bytes(padding)
        size += len(header) + len(data) + padding
    size += 2 * tarfile.BLOCKSIZE
    yield bytes(2 * tarfile.BLOCKSIZE + (-size % tarfile.RECORDSIZE))


def gzip_bytes(data: bytes) -> bytes:
    """One gzip member with a fixed header (mtime 0, no name) around ``data``."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    trailer = (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "little") + (
        len(data) & 0xFFFFFFFF
    ).to_bytes(4, "little")
    return GZIP_HEADER + body + trailer


# --- reading ------------------------------------------------------------------------------


def inflate_capped(decompressor, chunk: bytes, out: bytearray) -> str | None:
    """Decompress ``chunk`` onto ``out`` a slice at a time, so the cap holds to within one
    slice (a gzip bomb inflates 1 MiB of input to about 1 GiB); None, "too big" or the error."""
    pending = chunk
    try:
        while pending and not decompressor.eof:
            out += decompressor.decompress(pending, CHUNK)
            if len(out) > MAX_UNCOMPRESSED_BYTES:
                return "too big"
            pending = decompressor.unconsumed_tail
    except zlib.error as exc:
        return str(exc)
    return None


def unsafe_reason(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` may not be in a bundle, or None. Reads nothing but the header."""
    name = member.name
    if not name:
        return "member with an empty name"
    if name.startswith("/"):
        return f"{name!r}: absolute path"
    parts = name.split("/")
    if ".." in parts:
        return f"{name!r}: path goes up with '..'"
    if "\\" in name or any(part in ("", ".") for part in parts):
        return f"{name!r}: not a plain relative path ('.', '//' or '\\')"
    if not name.isprintable():
        return f"{name!r}: control characters in the name"
    if member.issparse():  # tarfile counts it regular; read, it expands past its size
        return f"{name!r}: a sparse file ({member.size} bytes once expanded); a bundle holds none"
    if member.issym() or member.islnk():
        kind = "symbolic link" if member.issym() else "hard link"
        target = member.linkname
        base = posixpath.dirname(name) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"{name!r}: {kind} to {target!r} points outside the bundle"
        return f"{name!r}: {kind} to {target!r}; a bundle holds regular files only"
    if not member.isreg():
        what = "directory" if member.isdir() else "special file (device, fifo)"
        return f"{name!r}: a {what}; a bundle holds regular files only"
    return None


class TarView(io.RawIOBase):
    """A read-only file over the tar in memory: tarfile reads it without a copy of it."""

    def __init__(self, data: bytearray) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        piece = self._view[self._pos : self._pos + len(buffer)]
        buffer[: len(piece)] = piece
        self._pos += len(piece)
        return len(piece)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def member_at(tar: bytearray, offset: int) -> str:
    try:
        with tarfile.open(fileobj=TarView(tar), mode="r:") as archive:
            for member in archive:
                end = member.offset_data + ((member.size + 511) // 512) * 512
                if member.offset <= offset < member.offset_data:
                    return f"the header of {member.name}"
                if member.offset_data <= offset < end:
                    return f"the data of {member.name}"
    except tarfile.TarError:
        pass
    return "the end-of-archive blocks"
