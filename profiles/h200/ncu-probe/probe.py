"""A paper-shaped table launch (torch's embedding_bag, 500K x 128 fp32, 2048 bags of 150) inside an NVTX range 'probe'."""
import torch
w = torch.rand(500_000, 128, device="cuda")
idx = torch.randint(0, 500_000, (2048 * 150,), device="cuda")
off = torch.arange(0, 2048 * 150, 150, device="cuda")
for _ in range(3):
    torch.nn.functional.embedding_bag(idx, w, off, mode="sum")
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("probe")
torch.nn.functional.embedding_bag(idx, w, off, mode="sum")
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
