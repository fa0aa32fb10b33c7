"""Constants of the tarindex on-disk format (docs/FORMAT.md) and of the tar specs we rely on.

Every constant is defined here only; each cites the section of docs/FORMAT.md or the tar
spec (POSIX.1-2001 pax/ustar, GNU tar manual "Basic Tar Format") it comes from.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = [
    "MAGIC",
    "END_MAGIC",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "HEADER",
    "FOOTER",
    "ALIGN",
    "OFFSET_DTYPE",
    "EXT_ID_DTYPE",
    "MAX_SAMPLES",
    "MAX_MEMBERS",
    "MAX_BLOB_BYTES",
    "FINGERPRINT_BYTES",
    "INDEX_SUFFIX",
    "SHARD_SUFFIXES",
    "MAX_META_BYTES",
    "RECORD",
    "TAG_TAR",
    "TAR_RECORD",
    "TAG_DATA_CRC",
    "CRC_DTYPE",
    "TAG_KEY_HASH",
    "KEY_HASH_DTYPE",
    "TAG_GZIP",
    "GZIP_RECORD",
    "GZIP_SEEK_MAGIC",
    "GZIP_SPACING",
    "MIN_GZIP_SPACING",
    "GZIP_WINDOW",
    "SHARD_ID_BYTES",
    "END_CHECK_BYTES",
    "HEADER_CHECKS",
    "ZSTD_DICT_MEMBER",
    "ZSTD_DICT_META",
    "ZSTD_DICT_MAGIC",
    "MAX_ZSTD_DICT_BYTES",
    "ZSTD_FRAME_MAGIC",
    "ZSTD_SKIPPABLE_MAGIC",
    "ZSTD_SKIPPABLE_MASK",
    "BLOCK",
    "TAR_RECORD_BYTES",
    "USTAR_MAX_SIZE",
    "TAR_NAME",
    "TAR_MODE",
    "TAR_UID",
    "TAR_GID",
    "TAR_SIZE",
    "TAR_MTIME",
    "TAR_CHKSUM",
    "TAR_TYPEFLAG",
    "TAR_LINKNAME",
    "TAR_MAGIC",
    "TAR_VERSION",
    "TAR_UNAME",
    "TAR_GNAME",
    "TAR_DEVMAJOR",
    "TAR_DEVMINOR",
    "TAR_PREFIX",
    "GNU_SPARSE_ISEXTENDED",
    "GNU_SPARSE_EXT_ISEXTENDED",
    "USTAR_MAGIC",
    "USTAR_VERSION",
    "CHKSUM_BLANK",
    "REGTYPE",
    "AREGTYPE",
    "LNKTYPE",
    "SYMTYPE",
    "CHRTYPE",
    "BLKTYPE",
    "DIRTYPE",
    "FIFOTYPE",
    "CONTTYPE",
    "XHDTYPE",
    "XGLTYPE",
    "SOLARIS_XHDTYPE",
    "GNUTYPE_DUMPDIR",
    "GNUTYPE_LONGLINK",
    "GNUTYPE_LONGNAME",
    "GNUTYPE_MULTIVOL",
    "GNUTYPE_NAMES",
    "GNUTYPE_SPARSE",
    "GNUTYPE_VOLHDR",
    "REGULAR_TYPES",
    "NO_DATA_TYPES",
]

# --- sidecar index (FORMAT.md §2) -------------------------------------------------------------
MAGIC = b"\x89TIDX\r\n\x1a"  # §2.1: non-ASCII first byte and CR/LF/^Z, as PNG does
END_MAGIC = b"TIDX"  # §2.7: last 4 bytes of every index file
FORMAT_MAJOR = 1  # §2.1: readers refuse an unknown major version
FORMAT_MINOR = 3  # §2.1: minor versions only add records (§2.8); readers skip unknown ones

# §2.1: magic, major, minor, flags, n_samples, n_members, n_exts, key_bytes, ext_bytes,
#       meta_bytes, tar_size, head_crc32, tail_crc32
HEADER = struct.Struct("<8sHHIQQQQQQQII")
FOOTER = struct.Struct("<I4s")  # §2.7: crc32 of all preceding bytes, END_MAGIC
ALIGN = 8  # §2: every section starts on an 8-byte boundary (numpy memmaps it in place)
OFFSET_DTYPE = np.dtype("<u8")  # §2.2-2.5: offsets, sizes and pointers, never native order
EXT_ID_DTYPE = np.dtype("<u4")  # §2.4
MAX_SAMPLES = 1 << 40  # §2.1: checked before allocating anything
MAX_MEMBERS = 1 << 42  # §2.1
MAX_BLOB_BYTES = 1 << 44  # key/ext/meta lengths: a reader limit, not stated in FORMAT.md
FINGERPRINT_BYTES = 4096  # §3: crc32 of the first and of the last 4096 bytes of the tar
INDEX_SUFFIX = ".tidx"  # §1: the index of ``x.tar`` is ``x.tar.tidx``
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")  # §1, §10: the shards a directory listing yields
MAX_META_BYTES = 1 << 20  # §2.6: the JSON metadata is small; checked before it is read
RECORD = struct.Struct("<4sIQ")  # §2.8: tag, reserved (0), length in bytes; data follows
TAG_TAR = b"TARX"  # §2.8.1 (1.1): shard id, end of the archive's data
TAR_RECORD = struct.Struct("<16sQQ")  # §2.8.1: shard_id, end, reserved (0)
TAG_DATA_CRC = b"DCRC"  # §2.8.2 (1.1): crc32 of every member's data
CRC_DTYPE = np.dtype("<u4")  # §2.8.2
TAG_KEY_HASH = b"KHSH"  # §2.8.3 (1.2): key table, sorted 32-bit key hashes + sample numbers
KEY_HASH_DTYPE = np.dtype("<u4")  # §2.8.3: both columns of the key table
TAG_GZIP = b"GZIX"  # §2.8.4 (1.3): a gzip-compressed shard's fingerprint and seek points
# §2.8.4: compressed size, crc32 of its first and last 4096 bytes, spacing, reserved (0)
GZIP_RECORD = struct.Struct("<QIIQQ")
GZIP_SEEK_MAGIC = b"GZIDX"  # §2.8.4: the seek points are an indexed_gzip/zran export (v0, v1)
GZIP_SPACING = 1 << 20  # §10: default bytes of uncompressed data between two seek points
MIN_GZIP_SPACING = 1 << 16  # §10: smallest spacing accepted (each point holds a 32 KiB window)
GZIP_WINDOW = 1 << 15  # §10: uncompressed bytes a seek point keeps (deflate's window, RFC 1951)
SHARD_ID_BYTES = 16  # §1, §2.8.1: random id the writer puts in the shard's first block
END_CHECK_BYTES = 64 * 1024  # §3: bytes after ``end`` read at open; they must be zeros
HEADER_CHECKS = 5  # §3: member headers re-read at open (first, quartiles, last)
ZSTD_DICT_MEMBER = b"__tarindex_zstd_dict__"  # §7: the shard's zstd dictionary (in no sample)
ZSTD_DICT_META = "zstd_dict"  # §7: metadata key of its entry (offset, size, crc32, dict_id)
ZSTD_DICT_MAGIC = 0xEC30A437  # §7: first 4 bytes (LE) of a zstd dictionary, RFC 8878 §5
MAX_ZSTD_DICT_BYTES = 1 << 24  # §7: a reader refuses a larger dictionary before reading it
# §7: a ``.zst`` member is zstd frames one after another (RFC 8878 §3.1; the writer makes one)
ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878 §3.1.1: 0xFD2FB528 (LE) starts a frame
ZSTD_SKIPPABLE_MAGIC = 0x184D2A50  # RFC 8878 §3.1.2: a skippable frame's magic (LE), low 4 bits
ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0  # free; its 4-byte LE size follows, then that many bytes

# --- tar (POSIX.1-1988 ustar, POSIX.1-2001 pax, GNU tar manual) --------------------------------
# Sources: IEEE Std 1003.1-2017, "pax" utility, "ustar Interchange Format" (the header layout,
# typeflags, chksum) and "pax Interchange Format" (typeflags 'x', 'g'); GNU tar manual, "Basic
# Tar Format" (GNU typeflags 'D' 'K' 'L' 'M' 'N' 'S' 'V', the old GNU sparse header). tarfile
# names the typeflags the same way; here each is the int value of the byte, as
# ``block[TAR_TYPEFLAG]`` gives it (``bytes((REGTYPE,))`` for the byte string).
BLOCK = 512  # every tar header and every member's padded data is a multiple of 512 bytes
TAR_RECORD_BYTES = 20 * BLOCK  # GNU tar and tarfile pad an archive to 10240-byte records
USTAR_MAX_SIZE = 8**11 - 1  # 11 octal digits in the ustar size field; larger sizes need pax

# Fields of the 512-byte header block, as slices (ustar "Interchange Format" table). One-byte
# fields are ints. Offsets relative to a header at ``pos``: ``pos + TAR_SIZE.start``.
TAR_NAME = slice(0, 100)  # name, NUL-terminated unless it fills the field
TAR_MODE = slice(100, 108)  # mode, octal
TAR_UID = slice(108, 116)  # uid, octal
TAR_GID = slice(116, 124)  # gid, octal
TAR_SIZE = slice(124, 136)  # size in bytes: octal, or GNU base-256 (high bit of byte 124 set)
TAR_MTIME = slice(136, 148)  # mtime, octal seconds since the epoch (or GNU base-256)
TAR_CHKSUM = slice(148, 156)  # chksum: header byte sum with this field taken as spaces
TAR_TYPEFLAG = 156  # typeflag, one byte
TAR_LINKNAME = slice(157, 257)  # linkname: target of a hard or symbolic link
TAR_MAGIC = slice(257, 263)  # magic: b"ustar\0" (POSIX), b"ustar " (GNU), NULs (v7)
TAR_VERSION = slice(263, 265)  # version: b"00" (POSIX), b" \0" (GNU)
TAR_UNAME = slice(265, 297)  # uname
TAR_GNAME = slice(297, 329)  # gname
TAR_DEVMAJOR = slice(329, 337)  # devmajor, octal
TAR_DEVMINOR = slice(337, 345)  # devminor, octal
TAR_PREFIX = slice(345, 500)  # prefix (ustar only): the path is prefix + "/" + name
GNU_SPARSE_ISEXTENDED = 482  # old GNU sparse header: non-zero if extension blocks follow
GNU_SPARSE_EXT_ISEXTENDED = 504  # in each sparse extension block: non-zero if another follows

USTAR_MAGIC = b"ustar\x00"  # TAR_MAGIC of a POSIX ustar header (GNU writes b"ustar " there)
USTAR_VERSION = b"00"  # TAR_VERSION of a POSIX ustar header
CHKSUM_BLANK = 8 * 0x20  # the chksum field counts as 8 spaces in the checksum (ustar "chksum")

REGTYPE = 0x30  # '0' regular file (POSIX)
AREGTYPE = 0x00  # NUL: regular file (pre-POSIX; v7 directory when the name ends in '/')
LNKTYPE = 0x31  # '1' hard link (POSIX)
SYMTYPE = 0x32  # '2' symbolic link (POSIX)
CHRTYPE = 0x33  # '3' character device (POSIX)
BLKTYPE = 0x34  # '4' block device (POSIX)
DIRTYPE = 0x35  # '5' directory (POSIX)
FIFOTYPE = 0x36  # '6' FIFO (POSIX)
CONTTYPE = 0x37  # '7' contiguous file: a regular file for every reader (POSIX)
XHDTYPE = 0x78  # 'x' pax extended header: records for the next member (POSIX.1-2001 pax)
XGLTYPE = 0x67  # 'g' pax global header: records for every later member (POSIX.1-2001 pax)
SOLARIS_XHDTYPE = 0x58  # 'X' Solaris extended header, read as 'x' (as GNU tar and tarfile do)
GNUTYPE_DUMPDIR = 0x44  # 'D' GNU incremental dump directory
GNUTYPE_LONGLINK = 0x4B  # 'K' GNU long link target for the next member
GNUTYPE_LONGNAME = 0x4C  # 'L' GNU long name for the next member
GNUTYPE_MULTIVOL = 0x4D  # 'M' GNU multi-volume continuation
GNUTYPE_NAMES = 0x4E  # 'N' old GNU long-name record (obsolete)
GNUTYPE_SPARSE = 0x53  # 'S' old GNU sparse file
GNUTYPE_VOLHDR = 0x56  # 'V' GNU volume label
# typeflags whose data is a regular file's bytes: the members tarindex indexes (POSIX: a
# reader treats '7' and the pre-POSIX NUL as '0')
REGULAR_TYPES = frozenset((REGTYPE, AREGTYPE, CONTTYPE))
# typeflags whose size field counts no data: no data blocks follow the header (POSIX ustar
# "typeflag": symbolic link, character and block device, directory, FIFO)
NO_DATA_TYPES = frozenset((SYMTYPE, CHRTYPE, BLKTYPE, DIRTYPE, FIFOTYPE))
