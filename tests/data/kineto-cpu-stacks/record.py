"""Record gpt2_cpu_stacks_modules.pt.trace.json.gz: a 2-layer Transformers GPT-2 (transformers
5.24.0, torch 2.13.0 CPU) forward and backward under torch.profiler with with_stack=True and
with_modules=True, on the CPU. Run from the repository root:

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python tests/data/kineto-cpu-stacks/record.py OUT.json
    gzip -9 OUT.json
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32))
x = torch.randint(0, 100, (2, 16))
with profile(activities=[ProfilerActivity.CPU], with_stack=True, with_modules=True) as prof:
    model(x, labels=x).loss.backward()
prof.export_chrome_trace(sys.argv[1])
