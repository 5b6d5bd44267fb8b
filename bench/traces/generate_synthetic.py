#!/usr/bin/env python3
"""Writes arcpool's synthetic multi-stream allocation traces in RMM's CSV columns
(Thread,Time,Action,Pointer,Size,Stream; stream as a hex handle, 0 the legacy default stream).

The real traces (kept outside the repository and replayed from ARCPOOL_TRACE_DIR) are
single-stream PyTorch runs. These add what they lack:
  training_comm.csv     a training step whose gradient buckets are handed to a communication
                        stream and freed there (cross-stream frees every step)
  inference_server.csv  an inference server: requests of variable batch size on four streams,
                        outputs handed to a copy stream
  dataframe.csv         an allocation-heavy data-frame step: many small column buffers and
                        temporaries of many sizes, freed out of order

Deterministic (fixed seeds): `python3 generate_synthetic.py [OUTDIR]` rewrites the same files.
"""
import os
import random
import sys

COMPUTE, COMM, COPY = 0x1000, 0x2000, 0x3000
SERVING = [0x4000, 0x5000, 0x6000, 0x7000]
MiB = 1 << 20


class Trace:
    def __init__(self, path):
        self.rows = []
        self.next_pointer = 0x7F0000000000
        self.t = 0.0
        self.path = path

    def alloc(self, size, stream):
        p = self.next_pointer
        self.next_pointer += (size + 511) // 512 * 512 + 512
        self._row("allocate", p, size, stream)
        return (p, size)

    def free(self, block, stream):
        self._row("free", block[0], block[1], stream)

    def _row(self, action, pointer, size, stream):
        self.t += 0.000007
        secs = int(self.t)
        stamp = "12:%02d:%02d.%06d" % (secs // 60 % 60, secs % 60, int((self.t - secs) * 1e6))
        self.rows.append("1,%s,%s,0x%x,%d,%x" % (stamp, action, pointer, size, stream))

    def write(self):
        with open(self.path, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n")
            f.write("\n".join(self.rows) + "\n")


def training_comm(path, steps=12, layers=24):
    rng = random.Random(1)
    t = Trace(path)
    weights = [t.alloc(rng.choice([4, 8, 16]) * MiB, COMPUTE) for _ in range(layers)]
    for _ in range(steps):
        activations = []
        for layer in range(layers):  # forward: activations and workspace on compute
            activations.append(t.alloc(rng.choice([6, 12, 24]) * MiB, COMPUTE))
            scratch = t.alloc(rng.randrange(1, 64) * 64 * 1024, COMPUTE)
            t.free(scratch, COMPUTE)
        bucket = []
        for layer in reversed(range(layers)):  # backward: grads into buckets for all-reduce
            grad = t.alloc(weights[layer][1], COMPUTE)
            t.free(activations[layer], COMPUTE)
            bucket.append(grad)
            if len(bucket) == 4:  # a bucket goes to the communication stream, freed there
                flat = t.alloc(sum(b[1] for b in bucket), COMM)
                for b in bucket:
                    t.free(b, COMM)
                t.free(flat, COMM)
                bucket = []
        for b in bucket:
            t.free(b, COMM)
        for _ in range(layers // 4):  # optimizer temporaries
            tmp = t.alloc(rng.choice([1, 2, 4]) * MiB, COMPUTE)
            t.free(tmp, COMPUTE)
    for w in weights:
        t.free(w, COMPUTE)
    t.write()


def inference_server(path, requests=400):
    rng = random.Random(2)
    t = Trace(path)
    model = [t.alloc(32 * MiB, 0) for _ in range(8)]
    pending = []
    for r in range(requests):
        stream = SERVING[r % len(SERVING)]
        batch = rng.choice([1, 1, 2, 4, 8, 16, 32, 64])
        kv = t.alloc(batch * 256 * 1024, stream)
        hidden = [t.alloc(batch * 64 * 1024, stream) for _ in range(6)]
        for h in hidden:
            t.free(h, stream)
        out = t.alloc(batch * 16 * 1024, stream)
        t.free(kv, stream)
        pending.append(out)  # outputs are copied out on the copy stream, freed there
        if len(pending) > 8 or rng.random() < 0.3:
            for o in pending:
                t.free(o, COPY)
            pending = []
    for o in pending:
        t.free(o, COPY)
    for m in model:
        t.free(m, 0)
    t.write()


def dataframe(path, steps=6, columns=40):
    rng = random.Random(3)
    t = Trace(path)
    for _ in range(steps):
        rows = rng.choice([10_000, 50_000, 200_000])
        cols = [t.alloc(rows * rng.choice([1, 4, 8]), COMPUTE) for _ in range(columns)]
        temps = []
        for _ in range(columns * 6):  # joins, group-bys, masks: many small temporaries
            temps.append(t.alloc(rng.randrange(1, 2048) * 64, COMPUTE))
            if len(temps) > 30 or rng.random() < 0.4:
                t.free(temps.pop(rng.randrange(len(temps))), COMPUTE)
        rng.shuffle(temps)
        for tmp in temps:
            t.free(tmp, COMPUTE)
        rng.shuffle(cols)
        for c in cols:
            t.free(c, COMPUTE)
    t.write()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    training_comm(os.path.join(out, "training_comm.csv"))
    inference_server(os.path.join(out, "inference_server.csv"))
    dataframe(os.path.join(out, "dataframe.csv"))


if __name__ == "__main__":
    main()
