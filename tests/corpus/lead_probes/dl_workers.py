# a plain loop whose DataLoader has 2 worker processes, each holding its own copy of a dataset
import torch, miles_profile as mp
from torch.utils.data import DataLoader, Dataset
class DS(Dataset):
    def __init__(self): self.x = torch.randn(20000, 512)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return self.x[i]
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
opt = torch.optim.AdamW(model.parameters())
dl = DataLoader(DS(), batch_size=256, num_workers=2, persistent_workers=True, shuffle=True)
for epoch in range(8):
    with mp.phase("train", rollout_id=epoch):
        for b in dl:
            model(b).square().mean().backward(); opt.step(); opt.zero_grad()
