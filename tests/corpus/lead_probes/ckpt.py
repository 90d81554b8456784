# a loop that saves a checkpoint every 3 iterations and keeps a list of float losses
import torch, os, tempfile, miles_profile as mp
d = tempfile.mkdtemp()
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
opt = torch.optim.Adam(model.parameters())
losses = []
for it in range(12):
    with mp.phase("train", rollout_id=it):
        for _ in range(15):
            loss = model(torch.randn(64, 1024)).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
            losses.append(loss.item())
    if it % 3 == 2:
        with mp.phase("checkpoint", rollout_id=it):
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(d, "ck.pt"))
import shutil; shutil.rmtree(d)
