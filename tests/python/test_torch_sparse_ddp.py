"""torch's DistributedDataParallel with sparse gradients (nn.Embedding(sparse=True) and
nn.EmbeddingBag(sparse=True), then a dense layer) trains on the "libcomm" backend to the
parameters gloo gives: 2 ranks, 20 SGD steps on rank-dependent batches, the same seed; every
parameter equal to gloo's (bitwise: both sum each index's rows in rank order, then average),
replicas identical. Also a direct sparse all_reduce against the dense sum. Exits 77 (meson: SKIP)
when the extension is not built.

usage: test_torch_sparse_ddp.py [WORLD_SIZE]"""

import os
import sys
import tempfile

import torch_backend_or_skip  # noqa: F401 - registers "libcomm", or SKIP

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

STEPS = 20


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.bag = nn.EmbeddingBag(40, 8, mode="sum", sparse=True)
        self.out = nn.Linear(16, 1)

    def forward(self, ids, bag_ids, offsets):
        return self.out(torch.cat([self.emb(ids).mean(1), self.bag(bag_ids, offsets)], dim=1))


def train(rank, size, backend, init, out):
    import libcomm.torch_backend  # noqa: F401 - spawned ranks register it too

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=size)
    # A direct sparse all_reduce first: rows that overlap across ranks and rows that do not.
    idx = torch.tensor([[rank, 3, 7 + rank]])
    val = torch.full((3, 2), float(rank + 1))
    t = torch.sparse_coo_tensor(idx, val, (10, 2))
    dense = sum(torch.sparse_coo_tensor(torch.tensor([[r, 3, 7 + r]]), torch.full((3, 2), float(r + 1)),
                                        (10, 2)).to_dense() for r in range(size))
    dist.all_reduce(t)
    assert t.is_sparse and torch.equal(t.to_dense(), dense), f"{backend}: sparse all_reduce {t.to_dense()} vs {dense}"

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        ids = torch.randint(0, 50, (4, 3), generator=gen)
        bag_ids = torch.randint(0, 40, (10,), generator=gen)
        offsets = torch.tensor([0, 3, 6, 8])
        target = torch.randn(4, 1, generator=gen)
        opt.zero_grad()
        loss = ((model(ids, bag_ids, offsets) - target) ** 2).mean()
        loss.backward()
        assert model.module.emb.weight.grad.is_sparse
        opt.step()
    torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, f"{out}.{backend}.{rank}")
    dist.destroy_process_group()


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for backend in ("libcomm", "gloo"):
            init = "file://" + os.path.join(tmp, backend + ".init")
            mp.spawn(train, args=(size, backend, init, os.path.join(tmp, "params")), nprocs=size, join=True)
            results[backend] = [torch.load(os.path.join(tmp, f"params.{backend}.{r}")) for r in range(size)]
        for backend, ranks in results.items():
            for r in range(1, size):
                for k in ranks[0]:
                    assert torch.equal(ranks[0][k], ranks[r][k]), f"{backend}: rank {r}'s {k} differs from rank 0's"
        worst = 0.0
        for k, ref in results["gloo"][0].items():
            ours = results["libcomm"][0][k]
            worst = max(worst, (ours - ref).abs().max().item())
            assert torch.equal(ours, ref), f"{k}: libcomm differs from gloo by {(ours - ref).abs().max().item():.3e}"
        print(f"ok: DDP with sparse Embedding and EmbeddingBag, {size} ranks, {STEPS} steps: every parameter "
              f"equal to gloo's (max difference {worst}), replicas identical", flush=True)


if __name__ == "__main__":
    main()
