"""PyTorch on arcpool: install before the first CUDA tensor, train, read arcpool's statistics.

    PYTHONPATH=build/python python3 examples/pytorch_dropin.py
"""
import arcpool.torch
import torch

if not torch.cuda.is_available():
    print(f"pytorch_dropin: needs a GPU (arcpool would use the {arcpool.DRIVER} driver)")
    raise SystemExit(0)

arcpool.torch.install()  # before any CUDA tensor exists

model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                            torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.AdamW(model.parameters())
side = torch.cuda.Stream()
for step in range(20):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    side.wait_stream(torch.cuda.current_stream())  # the side stream sees x written...
    with torch.cuda.stream(side):  # ...and reads it
        norm = x.norm()
    x.record_stream(side)  # so its free waits for the side stream (an arcpool use record)

torch.cuda.synchronize()
stats = arcpool.torch.stats()
print(f"pytorch_dropin: loss {float(loss):.4f}, peak allocated "
      f"{stats['allocated_bytes.all.peak'] / 2**20:.1f} MiB, peak reserved "
      f"{stats['reserved_bytes.all.peak'] / 2**20:.1f} MiB, "
      f"{stats['arcpool.use_records']} use records")
