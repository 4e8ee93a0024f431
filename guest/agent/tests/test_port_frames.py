"""The framing of the files and net ports (port_frames.py): frames, padding, and how a reader
left in the middle of a frame (a restored VM, a hostd that reconnected) finds the host's hello.
Run from the repository root:  python3 -m unittest discover -s guest/agent/tests -v
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from port_frames import (DATA, END, HEADER, JSON, MAX_PAYLOAD, SYNC, SYNC_EVENT, EofBackoff,
                         FrameReader, frame)

PADDING = bytes(MAX_PAYLOAD + HEADER.size)


def events(reader, data, piece=1):
    """Feeds data `piece` bytes at a time; returns every event produced."""
    out = []
    for i in range(0, len(data), piece):
        reader.feed(data[i:i + piece])
        while True:
            ev = reader.next()
            if ev is None:
                break
            out.append(ev)
    return out


class Frames(unittest.TestCase):
    def reader(self):
        return FrameReader((JSON, DATA, END))

    def test_frames_come_out_whole_however_the_bytes_are_cut(self):
        data = frame(JSON, 7, b'{"op":"x"}') + frame(DATA, 7, b"\0\xff" * 100) + frame(END, 7)
        for piece in (1, 3, 9, 64, len(data)):
            self.assertEqual(events(self.reader(), data, piece),
                             [(JSON, 7, b'{"op":"x"}'), (DATA, 7, b"\0\xff" * 100), (END, 7, b"")])

    def test_zero_bytes_between_frames_are_padding(self):
        data = bytes(5) + frame(DATA, 1, b"a") + bytes(100) + frame(END, 1)
        self.assertEqual(events(self.reader(), data, 7), [(DATA, 1, b"a"), (END, 1, b"")])

    def test_a_sync_at_a_frame_boundary_is_an_event(self):
        data = frame(DATA, 1, b"a") + PADDING + SYNC + frame(JSON, 0, b"{}")
        self.assertEqual(events(self.reader(), data, 4096),
                         [(DATA, 1, b"a"), SYNC_EVENT, (JSON, 0, b"{}")])

    def test_payload_bytes_are_never_taken_for_a_sync(self):
        data = frame(DATA, 1, SYNC + SYNC)
        self.assertEqual(events(self.reader(), data), [(DATA, 1, SYNC + SYNC)])


class Resync(unittest.TestCase):
    """The host sends PADDING + SYNC + hello after a restore; whatever state the reader was
    frozen in, the hello comes out right after a SYNC_EVENT."""

    hello = frame(JSON, 0, b'{"op":"hello"}')

    def after(self, stale):
        reader = FrameReader((JSON, DATA, END))
        got = events(reader, stale + PADDING + SYNC + self.hello, 4096)
        self.assertEqual(got[-2:], [SYNC_EVENT, (JSON, 0, b'{"op":"hello"}')])
        return got[:-2]

    def test_from_inside_a_payload(self):
        full = frame(DATA, 3, bytes(range(256)) * (MAX_PAYLOAD // 256))
        for cut in (HEADER.size + 1, len(full) // 2, len(full) - 1):
            self.after(full[:cut])

    def test_from_inside_a_header(self):
        full = frame(DATA, 0xFFFFFFFF, b"\xff" * MAX_PAYLOAD)
        for cut in range(1, HEADER.size):
            self.after(full[:cut])

    def test_from_inside_an_earlier_sync(self):
        for cut in (1, 8, len(SYNC) - 1):
            self.after(SYNC[:cut])

    def test_from_garbage(self):
        reader = FrameReader((JSON, DATA, END))
        stale = b"\x01garbage that is no frame" + os.urandom(3000)
        got = events(reader, stale + PADDING + SYNC + self.hello, 512)
        self.assertEqual(got[-2:], [SYNC_EVENT, (JSON, 0, b'{"op":"hello"}')])
        self.assertGreater(reader.desyncs, 0)

    def test_an_unknown_kind_or_an_oversized_length_is_a_desync(self):
        for bad in (HEADER.pack(0x7A, 1, 1) + b"x",
                    HEADER.pack(DATA, 1, MAX_PAYLOAD + 1)):
            reader = FrameReader((JSON, DATA, END))
            got = events(reader, bad + frame(DATA, 1, b"lost") + SYNC + self.hello, 100)
            self.assertEqual(got, [SYNC_EVENT, (JSON, 0, b'{"op":"hello"}')])

    def test_after_eof_a_reset_drops_the_torn_frame(self):
        reader = FrameReader((JSON, DATA, END))
        events(reader, frame(DATA, 1, b"x" * 100)[:50])
        reader.reset()
        self.assertEqual(events(reader, self.hello), [(JSON, 0, b'{"op":"hello"}')])



class PollingAfterEof(unittest.TestCase):
    def test_soon_at_first_then_at_most_once_a_second_and_soon_again_after_hostd_came(self):
        backoff = EofBackoff()
        delays = [backoff.next() for _ in range(8)]
        self.assertEqual(delays[0], 0.05)
        self.assertEqual(delays, sorted(delays))
        self.assertEqual(delays[-1], 1.0)
        backoff.reset()
        self.assertEqual(backoff.next(), 0.05)


if __name__ == "__main__":
    unittest.main()
