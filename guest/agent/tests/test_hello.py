"""The agent's hello as hostd writes it takes a fast path (hostd_wire.parse_hello_fast,
Agent.on_fast_hello): fewer guest blocks for a fork child to translate before it answers. It
must do everything the general path does: validate, set the clock, reseed the kernel RNG,
count a copy, answer with the same reply; and anything else must still take the general path."""

import json
import os
import threading
import time
import unittest
from unittest import mock

from agent_harness import AgentTestCase
import agent as agent_module
import guest_system
import net_relay
from agent import Agent
from hostd_wire import parse_hello_fast, write_all

SEED = bytes(range(32))


def hostd_hello(nonce="0123abcd", time_ns="1795830029481000000", seed=SEED.hex(), copy=True,
                **extra):
    """A hello exactly as hostd writes it (JSON.stringify: no spaces, this key order)."""
    msg = {"op": "hello", "nonce": nonce, "time_ns": time_ns, "seed": seed, "copy": copy}
    msg.update(extra)
    return json.dumps(msg, separators=(",", ":")).encode()


class FastHelloParse(unittest.TestCase):
    def test_hostds_hello_is_parsed(self):
        self.assertEqual(parse_hello_fast(hostd_hello()),
                         (b"0123abcd", 1795830029481000000, SEED, True))
        self.assertEqual(parse_hello_fast(hostd_hello(copy=False))[3], False)

    def test_any_other_shape_is_left_to_the_general_path(self):
        for line in (
            hostd_hello(nonce='a"b'),              # an escaped quote
            hostd_hello(nonce="a\\b"),             # an escaped backslash
            hostd_hello(nonce="a-b"),              # not letters and digits alone
            hostd_hello(nonce=""),
            hostd_hello(nonce="é"),                # non-ASCII
            hostd_hello(time_ns="-1"),
            hostd_hello(time_ns=""),
            hostd_hello(time_ns="9" * 5000),       # beyond int()'s digits: the general path logs it
            hostd_hello(seed="zz" * 32),           # not hex
            hostd_hello(seed="00" * 31),           # not 32 bytes
            hostd_hello(copy="yes"),
            hostd_hello(extra=1),                  # a field more
            json.dumps({"op": "hello", "nonce": "n", "time_ns": "1", "seed": SEED.hex(),
                        "copy": True}).encode(),   # spaces: not hostd's writing
            hostd_hello().replace(b'"time_ns":"1795830029481000000"', b'"time_ns":1795'),
            hostd_hello() + b" ",
            b'{"op":"hello","nonce":"n"}',
        ):
            with self.subTest(line=line):
                self.assertIsNone(parse_hello_fast(line))


class FakeChannel:
    def __init__(self):
        self.written, self.controls = [], []

    def write(self, chunks):
        self.written.append(b"".join(chunks))

    def send_control(self, msg):
        self.controls.append(msg)


class FakeSupervisor:
    def __init__(self):
        self.hellos = []

    def on_hello(self, copy):
        self.hellos.append(copy)


class FastHelloEffects(unittest.TestCase):
    """An Agent of a VM (system=True) with the kernel calls recorded, not made."""

    def setUp(self):
        self.calls = []
        for name in ("set_clock", "reseed_kernel", "reseed_kernel_raw"):
            patcher = mock.patch.object(
                guest_system, name,
                side_effect=lambda *a, _n=name: self.calls.append((_n,) + a[:-1]))
            patcher.start()
            self.addCleanup(patcher.stop)
        patcher = mock.patch.object(net_relay, "_serving", None)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.channel, self.supervisor = FakeChannel(), FakeSupervisor()
        with mock.patch.object(guest_system, "claim_upper_dir", return_value=None):
            self.agent = Agent(self.channel, None, None, self.supervisor, system=True)

    def test_it_sets_the_clock_reseeds_and_counts_the_copy_before_answering(self):
        self.agent.handle_line(hostd_hello(copy=False))
        self.assertEqual(self.calls, [("set_clock", 1795830029481000000),
                                      ("reseed_kernel_raw", SEED)])
        self.assertEqual(self.supervisor.hellos, [False])
        self.assertEqual(len(self.channel.written), 1)
        self.assertEqual(self.channel.controls, [])

    def test_its_reply_is_the_general_paths(self):
        self.agent.handle_line(hostd_hello(nonce="abc"))
        fast = self.channel.written.pop()
        self.agent.handle_line(json.dumps({"op": "hello", "nonce": "abc", "time_ns": "1",
                                           "seed": SEED.hex(), "copy": True}).encode())
        general = self.channel.written.pop()
        self.assertTrue(fast.endswith(b"\n"))
        self.assertEqual(json.loads(fast), json.loads(general))
        self.assertEqual(json.loads(fast), {"op": "hello", "nonce": "abc", "pid": os.getpid(),
                                            "python": agent_module.PYTHON_VERSION, "net": None,
                                            "prepare_pause": True})
        self.assertEqual([c[0] for c in self.calls],
                         ["set_clock", "reseed_kernel_raw", "set_clock", "reseed_kernel"])
        self.assertEqual(self.supervisor.hellos, [True, True])

    def test_a_quiet_relays_ports_are_in_the_reply(self):
        class Relay:
            def quiet_state(self):
                return {"ports": [22, 8000]}

            quiet_state_json = net_relay.Relay.quiet_state_json   # the real encoding

        with mock.patch.object(net_relay, "_serving", Relay()):
            self.agent.handle_line(hostd_hello())
        self.assertEqual(json.loads(self.channel.written[0])["net"], {"ports": [22, 8000]})

    def test_a_hello_it_cannot_take_still_gets_the_general_checks(self):
        self.agent.handle_line(b'{"op":"hello","nonce":5,"time_ns":"1","seed":"00","copy":true}')
        self.assertEqual(self.channel.written, [])
        self.assertEqual(self.calls, [])
        self.assertEqual(self.channel.controls,
                         [{"op": "error", "message": "hello: nonce must be a string"}])


class WriteAll(unittest.TestCase):
    def test_a_short_write_is_finished_on_blocking_and_non_blocking_fds(self):
        for blocking in (True, False):
            with self.subTest(blocking=blocking):
                r, w = os.pipe()
                self.addCleanup(os.close, r)
                self.addCleanup(os.close, w)
                os.set_blocking(w, blocking)
                data = os.urandom(1 << 20)   # more than a pipe takes at once
                got = bytearray()

                def drain():
                    while len(got) < len(data):
                        got.extend(os.read(r, 65536))

                reader = threading.Thread(target=drain)
                reader.start()
                write_all(w, data)
                reader.join(10)
                self.assertEqual(bytes(got), data)


class KernelReseed(unittest.TestCase):
    def test_hex_and_raw_seeds_make_the_same_ioctls(self):
        for call, seed in ((guest_system.reseed_kernel, SEED.hex()),
                           (guest_system.reseed_kernel_raw, SEED),
                           (guest_system.reseed_kernel_raw, b"\x01" * 8)):
            with self.subTest(seed=seed), \
                    mock.patch.object(guest_system, "_urandom_fd", 99), \
                    mock.patch.object(guest_system.fcntl, "ioctl") as ioctl:
                call(seed, lambda *a: self.fail(a))
                raw = seed if isinstance(seed, bytes) else bytes.fromhex(seed)
                self.assertEqual(ioctl.call_args_list, [
                    mock.call(99, guest_system.RNDADDENTROPY,
                              guest_system.struct.pack("ii", len(raw) * 8, len(raw)) + raw),
                    mock.call(99, guest_system.RNDRESEEDCRNG)])


class FastHelloOverThePort(AgentTestCase):
    """The real agent, fed hostd's bytes."""

    def test_hostds_hello_is_echoed(self):
        self.agent.send_raw(hostd_hello(nonce="f00d") + b"\n")
        msg = self.agent.recv()
        self.assertEqual((msg["op"], msg["nonce"], msg["pid"], msg["prepare_pause"]),
                         ("hello", "f00d", self.agent.proc.pid, True))

    def test_garbage_glued_before_hostds_hello_is_discarded(self):
        self.agent.send_raw(b'{"op":"exec","id":9,"langu' + hostd_hello(nonce="b0b") + b"\n")
        msg = self.agent.recv()
        self.assertEqual((msg["op"], msg["nonce"]), ("hello", "b0b"))


if __name__ == "__main__":
    unittest.main()
