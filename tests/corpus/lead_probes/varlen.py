# sequence lengths that vary per iteration (packing of real data): peaks move, the floor must not be a leak
import torch, random, miles_profile as mp
random.seed(0)
emb = torch.nn.Embedding(5000, 256); layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
opt = torch.optim.AdamW(list(emb.parameters()) + list(layer.parameters()))
for it in range(12):
    with mp.phase("train", rollout_id=it):
        for _ in range(6):
            n = random.choice([64, 128, 256, 512])
            x = torch.randint(0, 5000, (16, n))
            layer(emb(x)).square().mean().backward(); opt.step(); opt.zero_grad()
