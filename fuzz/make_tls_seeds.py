#!/usr/bin/env python3
"""Writes the seed corpus of the TLS fuzz targets (fuzz/corpus/tls_records/ and
fuzz/corpus/tls_handshake_messages/): their input formats are binary, described at the top of
fuzz_tls_records.cc and fuzz_tls_handshake_messages.cc. Run from anywhere; it overwrites the
seeds."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ALERT, HANDSHAKE, APP = 21, 22, 23


def key_update(requested):
    return bytes([24, 0, 0, 1, requested])


def ticket(body_len):
    return bytes([4, body_len >> 16, (body_len >> 8) & 0xFF, body_len & 0xFF]) + bytes(
        (i * 7) & 0xFF for i in range(body_len))


# tls-records: a settings byte (bit 0 the receiver is the client, bit 1 the sender closes, bits
# 2-7 the read sizes), then chunks [kind][length, 2 bytes][content], bit 7 of kind: unsealed.
def settings(client=False, shut=True, reads=0):
    return bytes([int(client) | int(shut) << 1 | reads << 2])


def sealed(kind, content):
    return bytes([kind, len(content) >> 8, len(content) & 0xFF]) + content


def raw(content):
    return sealed(0x80, content)


def fragments(kind, content, size):
    return b"".join(sealed(kind, content[i:i + size]) for i in range(0, len(content), size))


RECORDS = {
    "key-update": settings(reads=0) + sealed(APP, b"under the first key")
    + sealed(HANDSHAKE, key_update(0)) + sealed(APP, b"under the second key")
    + sealed(HANDSHAKE, key_update(1)[:2]) + sealed(HANDSHAKE, key_update(1)[2:])
    + sealed(APP, b"under the third key"),
    "fragmented-ticket": settings(client=True, reads=5)
    + fragments(HANDSHAKE, ticket(300) + key_update(0), 128) + sealed(APP, b"after the ticket"),
    "ticket-to-server": settings(client=False, reads=9) + sealed(HANDSHAKE, ticket(40))
    + sealed(APP, b"never read"),
    "data-between-fragments": settings(client=True, reads=3) + sealed(HANDSHAKE, ticket(100)[:50])
    + sealed(APP, b"refused") + sealed(HANDSHAKE, ticket(100)[50:]),
    "alert": settings(reads=1) + sealed(APP, b"before the alert") + sealed(ALERT, bytes([2, 40]))
    + sealed(APP, b"never read"),
    "close-notify": settings(shut=False, reads=2) + sealed(APP, b"before the close")
    + sealed(ALERT, bytes([1, 0])) + sealed(APP, b"after the close: never read") + raw(b"\x17\x03\x03\xff\xff"),
    "padding": settings(reads=7) + sealed(0, b"padded data" + bytes([APP]) + bytes(200))
    + sealed(0, key_update(0) + bytes([HANDSHAKE]) + bytes(3)) + sealed(APP, b"")
    + sealed(0, bytes(16)),
    "garbage-header": settings(reads=4) + sealed(APP, b"before the garbage")
    + raw(b"\x16\x03\x01\x00\x10garbage garbage!"),
    "cut-record": settings(reads=6) + sealed(APP, b"whole") + raw(b"\x17\x03\x03\x00\x40only part"),
    "record-overflow": settings(shut=False, reads=8) + sealed(APP, bytes(range(256)) * 64)
    + sealed(APP, b"x" * 16385),
    "unknown-type": settings(reads=10) + sealed(APP, b"a") + sealed(24, b"heartbeat?"),
}

# tls-handshake-messages: records [n < 128][n bytes] or [0x80][length, 2 bytes][filler byte].
def rec(content):
    assert len(content) < 128
    return bytes([len(content)]) + content


def filler(length, byte):
    return bytes([0x80, length >> 8, length & 0xFF, byte])


big = ticket(0)[:1] + bytes([1, 0, 0])  # a NewSessionTicket of kMaxMessage (64 KiB) bytes
HANDSHAKE_MESSAGES = {
    "key-update": rec(key_update(0)) + rec(key_update(1)),
    "key-update-fragmented": rec(key_update(1)[:1]) + rec(key_update(1)[1:4]) + rec(key_update(1)[4:]),
    "fragmented-ticket": b"".join(rec(ticket(200)[i:i + 100]) for i in range(0, 204, 100))
    + rec(ticket(20) + key_update(0)),
    "max-ticket": rec(big) + filler(16384, 0x5A) * 3 + filler(16383, 0xA5)
    + rec(b"\x01" + key_update(0)),
    "ticket-too-big": rec(bytes([4, 1, 0, 1])),
    "key-update-then-more": rec(key_update(0) + key_update(0)[:2]),
    "key-update-asking-2": rec(key_update(2)),
    "empty-record": rec(key_update(0)) + rec(b""),
    "client-hello": rec(bytes([1, 0, 0, 2, 3, 3])),
}

for folder, seeds in (("tls_records", RECORDS), ("tls_handshake_messages", HANDSHAKE_MESSAGES)):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
