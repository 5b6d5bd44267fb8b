"""arcpool.ipc (docs/design.md §14) from Python: the exporter here, the importer a child Python
process given its end of a socketpair. The two-process tests run where arcpool's driver is CUDA
(a GPU, or simcuda: the simcuda presets and device-check); the host driver's refusal runs
where it is the driver.
"""
import ctypes
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import arcpool
import arcpool.ipc as ipc
import cuda_runtime

MIB = 1 << 20

# The importing process: joins the exporter on descriptor FD, receives one allocation, checks
# its bytes through the CUDA runtime, reports on stdout, then follows the parent's word on its
# standard input: "free" (deallocate and release, then exit) or nothing (wait to be killed).
_CHILD = textwrap.dedent("""
    import ctypes, socket, sys
    import arcpool.ipc as ipc
    rt = ctypes.CDLL("libcudart.so.13")
    importer = ipc.Importer(int(sys.argv[1]))
    block = importer.receive()
    host = (ctypes.c_ubyte * block.nbytes)()
    assert rt.cudaMemcpy(host, ctypes.c_void_p(block.ptr), ctypes.c_size_t(block.nbytes), 2) == 0
    print("received", block.nbytes, host[0], host[block.nbytes - 1], flush=True)
    if sys.stdin.readline().strip() == "free":
        block.deallocate()
        block.release()
        importer.close()
        assert rt.cudaDeviceSynchronize() == 0
        print("freed", flush=True)
""")


def _eventually(predicate, seconds=20):
    deadline = time.time() + seconds
    while not predicate() and time.time() < deadline:
        time.sleep(0.01)
    return predicate()


@unittest.skipUnless(arcpool.DRIVER == "cuda" and cuda_runtime.load() is not None,
                     "arcpool's CUDA driver (a GPU or simcuda) and libcudart are not available")
class TwoProcesses(unittest.TestCase):
    def setUp(self):
        self.rt = cuda_runtime.load()
        self.ours, theirs = socket.socketpair()
        self.child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        theirs.close()  # the child has its copy
        self.allocator = ipc.SharedAllocator()
        self.exporter = ipc.Exporter(self.allocator, self.ours)
        self.ours.close()  # the exporter has its copy
        self.block = self.allocator.allocate(MIB)
        self.assertEqual(0, self.rt.cudaMemsetAsync(ctypes.c_void_p(self.block.ptr), 7,
                                                    ctypes.c_size_t(MIB), None))
        self.exporter.send(self.block)  # the importer's first use waits for the fill
        self.assertEqual(f"received {MIB} 7 7", self.line())
        self.assertEqual(1, self.exporter.outstanding)

    def line(self, seconds=60):
        """The importer's next line; a failure, with the importer killed, after `seconds`."""
        said = []
        reader = threading.Thread(target=lambda: said.append(self.child.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(seconds)
        if not said:
            self.child.kill()
            self.fail(f"the importer said nothing in {seconds} s")
        return said[0].strip()

    def tearDown(self):
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait()
        self.child.stdin.close()
        self.child.stdout.close()
        self.exporter.close()
        self.allocator.close()

    def finish(self):
        """The exporter's free, then everything back."""
        self.block.deallocate()
        self.block.release()
        self.assertEqual(0, self.rt.cudaDeviceSynchronize())

    def test_an_import_sees_the_exporters_writes_and_its_release_ends_the_claim(self):
        self.child.stdin.write("free\n")
        self.child.stdin.flush()
        self.assertEqual("freed", self.line())
        self.assertEqual(0, self.child.wait(timeout=60))
        self.assertTrue(_eventually(lambda: self.exporter.outstanding == 0),
                        "the importer's release did not end the exporter's claim")
        self.finish()

    def test_a_killed_importer_is_noticed_and_its_claim_ends(self):
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=60)
        self.assertTrue(_eventually(lambda: self.exporter.outstanding == 0),
                        "the importer's death did not end the exporter's claim")
        self.finish()


# An exporting process that shares its pool, sends nothing and exits.
_EXPORTER_THAT_EXITS = textwrap.dedent("""
    import sys
    import arcpool.ipc as ipc
    allocator = ipc.SharedAllocator()
    exporter = ipc.Exporter(allocator, int(sys.argv[1]))
""")


@unittest.skipUnless(arcpool.DRIVER == "cuda" and cuda_runtime.load() is not None,
                     "arcpool's CUDA driver (a GPU or simcuda) and libcudart are not available")
class ExporterGone(unittest.TestCase):
    def test_a_receive_after_the_exporter_exited_raises_peer_gone(self):
        ours, theirs = socket.socketpair()
        child = subprocess.Popen([sys.executable, "-c", _EXPORTER_THAT_EXITS,
                                  str(theirs.fileno())], pass_fds=(theirs.fileno(),))
        theirs.close()
        with ipc.Importer(ours) as importer:
            ours.close()
            self.assertEqual(0, child.wait(timeout=60))
            with self.assertRaises(ipc.ArcpoolError) as gone:
                importer.receive()
            self.assertEqual("ARCPOOL_STATUS_PEER_GONE", gone.exception.status)


class Sockets(unittest.TestCase):
    def test_a_socket_with_a_timeout_is_refused_as_non_blocking(self):
        # Python makes a socket with a timeout non-blocking (O_NONBLOCK), which arcpool's IPC
        # cannot wait on: refused up front, whatever the driver, the socket left the caller's.
        a, b = socket.socketpair()
        a.settimeout(30)
        b.settimeout(30)
        with ipc.SharedAllocator() as allocator:
            for make in (lambda: ipc.Exporter(allocator, a),
                         lambda: ipc.Importer(b, allocator=allocator)):
                with self.assertRaises(ipc.ArcpoolError) as refused:
                    make()
                self.assertEqual("ARCPOOL_STATUS_INVALID_ARGUMENT", refused.exception.status)
                self.assertIn("setblocking(True)", str(refused.exception))
        a.sendall(b"x")
        self.assertEqual(b"x", b.recv(1), "a refusal left the sockets open")
        a.close()
        b.close()


@unittest.skipUnless(arcpool.DRIVER == "host", "the host driver is not the driver here")
class HostDriver(unittest.TestCase):
    def test_the_host_driver_shares_no_memory_and_the_sockets_stay_the_callers(self):
        a, b = socket.socketpair()
        with ipc.SharedAllocator() as allocator:
            with self.assertRaises(ipc.ArcpoolError) as refused:
                ipc.Exporter(allocator, a)
            self.assertEqual("ARCPOOL_STATUS_UNSUPPORTED", refused.exception.status)
            self.assertIn("shares no memory between processes", str(refused.exception))
            with self.assertRaises(ipc.ArcpoolError) as refused:
                ipc.Importer(b, allocator=allocator)
            self.assertEqual("ARCPOOL_STATUS_UNSUPPORTED", refused.exception.status)
            a.sendall(b"x")
            self.assertEqual(b"x", b.recv(1), "a refusal left the sockets open")
            block = allocator.allocate(4096)
            interface = block.__cuda_array_interface__
            self.assertEqual(((4096,), "|u1", (block.ptr, False)),
                             (interface["shape"], interface["typestr"], interface["data"]))
            block.deallocate()
            block.release()
            with self.assertRaises(ValueError):
                block.ptr
        a.close()
        b.close()


class Streams(unittest.TestCase):
    def test_streams_are_handles_cupy_and_torch_streams_or_none(self):
        class CuPyStream:
            ptr = 0x1234

        class TorchStream:
            cuda_stream = 0x5678

        self.assertIsNone(ipc._stream(None))
        self.assertIsNone(ipc._stream(0))
        self.assertEqual(0x42, ipc._stream(0x42))
        self.assertEqual(0x1234, ipc._stream(CuPyStream()))
        self.assertEqual(0x5678, ipc._stream(TorchStream()))
        with self.assertRaises(TypeError):
            ipc._stream("stream")


if __name__ == "__main__":
    unittest.main()
