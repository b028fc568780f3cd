#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (tests/fuzz/corpus/<target>/): valid and nearly valid
inputs, so the fuzzer starts past the magic and version checks. The layouts are those of
transports/frame.h and transports/tcp/wire.h (little-endian). Rerun after a wire change."""

from __future__ import annotations

import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAGIC = 0x4C43434E
FRAME_VERSION = 1
HANDSHAKE_VERSION = 5


def fnv1a(s: str) -> int:
    h = 1469598103934665603
    for c in s.encode():
        h ^= c
        h = (h * 1099511628211) & (2**64 - 1)
    return h


def frame(kind: int, op: int, dtype: int, total: int, offset: int, length: int,
          codec: int = 0, seq: int = 1) -> bytes:
    return struct.pack("<IHBBBBBBiIIQQQQQ", MAGIC, FRAME_VERSION, kind, op, dtype, 0, codec, 0,
                       -1, 0, 0, seq, total, total, offset, length)


def hello(rank: int = 1, size: int = 2, socket: int = 0, version: int = HANDSHAKE_VERSION,
          comm: str = "fuzz") -> bytes:
    return struct.pack("<IHHiiQ32s", MAGIC, version, socket, rank, size, fnv1a(comm),
                       bytes(range(32)))


def proof() -> bytes:
    return struct.pack("<II32s", MAGIC, 0, b"\x5a" * 32)


SEEDS: dict[str, dict[str, bytes]] = {
    "fuzz_frame_header": {
        "data": frame(1, 1, 0, 4096, 0, 4096),
        "stripe": frame(1, 1, 0, 1 << 20, 4096, 8192),
        "abort": frame(2, 0, 0, 12, 0, 12),
        "p2p": frame(1, 9, 3, 64, 0, 64, seq=7),
        "bad-slice": frame(1, 1, 0, 16, 8, 16),
        "huge": frame(1, 1, 0, 1 << 60, 0, 16),
    },
    "fuzz_record": {
        "empty": b"\x00" + b"\x11" * 16,
        "header-sized": b"\x01" + b"\x22" * (64 + 16),
        "small": b"\x02" + b"\x33" * (1000 + 16),
    },
    "fuzz_settings": {
        "nsocks": b"nsocks\x004",
        "env-name": b"NANOCCL_NSOCKS\x0064",
        "encrypt": b"NANOCCL_ENCRYPT\x001",
        "compression": b"compression\x00int8",
        "block": b"compression_block\x0096",
        "secret": b"secret\x000123456789abcdef0123",
        "secret-file": b"secret_file\x00/tmp/none",
        "file-content": b"f00dfeedcafe0123456789abcdef0042\n",
        "unknown": b"carrier_pigeon\x001",
    },
    "fuzz_handshake": {
        "hello": hello(),
        "hello-proof": hello() + proof(),
        "second-socket": hello(socket=1) + proof(),
        "old-version": hello(version=4),
        "other-comm": hello(comm="other"),
        "absurd": hello(rank=1 << 30, size=-1, socket=0xFFFF) + proof(),
        "garbage": bytes(range(256)),
    },
}


def main() -> None:
    for target, seeds in SEEDS.items():
        d = HERE / "corpus" / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (d / name).write_bytes(data)


if __name__ == "__main__":
    main()
