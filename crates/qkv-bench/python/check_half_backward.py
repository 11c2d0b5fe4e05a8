#!/usr/bin/env python3
"""The bf16 backward's error against float64, qkv's at every level beside PyTorch's. Outside CI
(PyTorch is not there):

    cargo run --release -p qkv-bench --example half_backward_error -- 1024 > /tmp/half.json
    /root/torch-venv/bin/python crates/qkv-bench/python/check_half_backward.py /tmp/half.json

The truth is torch.autograd through SDPA in float64 on the same bf16 inputs. Printed: the largest
absolute error of dQ, dK and dV for each qkv level (f32 gradients) and for PyTorch's bf16 SDPA
forward and backward (bf16 gradients), and the largest |gradient| for scale. Exits 1 if a qkv
level's error exceeds PyTorch's for any gradient, or is NaN.
"""

import json
import sys

import torch
import torch.nn.functional as F

D = 64


def main():
    case = json.load(open(sys.argv[1]))
    n = case["n"]

    def tensor(name, dtype):
        return torch.tensor(case[name], dtype=torch.float64).view(1, 1, n, D).to(dtype)

    def gradients(dtype):
        q, k, v = (tensor(x, dtype).requires_grad_() for x in "qkv")
        F.scaled_dot_product_attention(q, k, v).backward(tensor("d_output", dtype))
        return [x.grad.double().view(n, D) for x in (q, k, v)]

    truth = gradients(torch.float64)
    print(f"n = {n}, d = {D}; largest |dq|, |dk|, |dv|:", " ".join(f"{g.abs().max().item():.3g}" for g in truth))

    def errors(grads):
        return [(g - w).abs().max().item() for g, w in zip(grads, truth)]

    torch_errors = errors(gradients(torch.bfloat16))
    print(f"{'torch bf16 sdpa':18} dq dk dv max abs error:", " ".join(f"{e:.3g}" for e in torch_errors))
    failed = []
    for level, grads in case["levels"].items():
        ours = errors([torch.tensor(g, dtype=torch.float64).view(n, D) for g in grads])
        print(f"{'qkv ' + level:18} dq dk dv max abs error:", " ".join(f"{e:.3g}" for e in ours))
        if any(not (e <= t) for e, t in zip(ours, torch_errors)):
            failed.append(level)
    if failed:
        print("above PyTorch's bf16 error:", ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
