# a user's Ray job: a policy actor trains, a reference actor scores (forward only), 8 iterations, two processes
import ray, torch, miles_profile as mp

@ray.remote(num_cpus=0)
class Policy:
    def __init__(self):
        self.m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(6)])
        self.opt = torch.optim.AdamW(self.m.parameters())
    def train(self, it):
        with mp.phase("train", rollout_id=it):
            for _ in range(20):
                self.m(torch.randn(64, 1024)).square().mean().backward(); self.opt.step(); self.opt.zero_grad()
        return it

@ray.remote(num_cpus=0)
class Reference:
    def __init__(self):
        self.m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(6)]).eval()
    def score(self, it):
        with mp.phase("ref_logprobs", rollout_id=it), torch.no_grad():
            for _ in range(30):
                self.m(torch.randn(64, 1024))
        return it

ray.init(address="auto")
pol, ref = Policy.remote(), Reference.remote()
for it in range(8):
    ray.get(ref.score.remote(it)); ray.get(pol.train.remote(it))
ray.shutdown()
