"""The head of the autoscaling tests' training scripts: a Dataset whose every sample costs the
seconds written in a file (a sleep, so the test can make it cheap mid-run), each sample the same
wherever it is made. Defined in the script's __main__, it reaches the offloaders' workers by value."""

HEAD = r'''
import hashlib, json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Costly(Dataset):
    def __init__(self, cost_file, n):
        self.cost_file, self.n = cost_file, n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        with open(self.cost_file) as f:
            time.sleep(float(f.read() or 0))
        g = torch.Generator().manual_seed(i)
        return torch.rand(8, generator=g), i
'''
