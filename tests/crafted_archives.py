"""Hand-made tar members that the kit's readers must refuse (shared by several test files)."""

from __future__ import annotations

import tarfile


def gnu_sparse_member(name: str, real_size: int) -> bytes:
    """One GNU sparse header (type 'S') with no stored data that reads back as ``real_size``
    zero bytes: a few hundred bytes on disk, any size in memory once read."""
    block = bytearray(tarfile.BLOCKSIZE)

    def put(offset: int, width: int, value: bytes) -> None:
        block[offset : offset + len(value)] = value[:width]

    def octal(value: int, width: int) -> bytes:
        return b"%0*o\0" % (width - 1, value)

    put(0, 100, name.encode())
    put(100, 8, octal(0o644, 8))
    put(108, 8, octal(0, 8))
    put(116, 8, octal(0, 8))
    put(124, 12, octal(0, 12))  # stored bytes: none
    put(136, 12, octal(0, 12))
    block[148:156] = b" " * 8
    block[156] = ord(tarfile.GNUTYPE_SPARSE)
    put(257, 8, tarfile.GNU_MAGIC)
    put(386, 12, octal(0, 12))  # one sparse entry: offset 0, 0 bytes of data
    put(398, 12, octal(0, 12))
    put(483, 12, octal(real_size, 12))  # the size it expands to
    checksum = sum(block)
    block[148:156] = b"%06o\0 " % checksum
    return bytes(block)


def sparse_tar(name: str = "big.bin", real_size: int = 512 << 20) -> bytes:
    """A whole tar of one sparse member: 2.5 KiB that reads as ``real_size`` bytes."""
    return gnu_sparse_member(name, real_size) + bytes(2 * tarfile.BLOCKSIZE)
