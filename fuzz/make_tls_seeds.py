#!/usr/bin/env python3
"""Writes the seed corpus of the TLS fuzz targets (fuzz/corpus/tls_handshake_messages/): its input
format is binary, described at the top of fuzz_tls_handshake_messages.cc. Run from anywhere; it overwrites the seeds."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def key_update(requested):
    return bytes([24, 0, 0, 1, requested])


def ticket(body_len):
    return bytes([4, body_len >> 16, (body_len >> 8) & 0xFF, body_len & 0xFF]) + bytes(
        (i * 7) & 0xFF for i in range(body_len))


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

for folder, seeds in (("tls_handshake_messages", HANDSHAKE_MESSAGES),):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
