"""A Lightning-style module collecting `training_step_outputs` (logits and loss) that are never cleared at
the end of the epoch, run by a minimal fit loop.

Expected: leak, one step = one optimizer step, born in forward(), held by `training_step_outputs`.
"""

import torch
import torch.nn.functional as F
from torch import nn


class LitClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
        self.training_step_outputs: list[dict] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # SITE

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.training_step_outputs.append({"loss": loss, "logits": logits})
        return loss

    def on_train_epoch_end(self) -> None:
        epoch_loss = torch.stack([o["loss"] for o in self.training_step_outputs]).mean()
        print(f"epoch loss {epoch_loss.item():.4f}")
        # missing: self.training_step_outputs.clear()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
lit = LitClassifier().to(device)
opt = lit.configure_optimizers()
train_batches = [
    (torch.randn(512, 512, device=device), torch.randint(0, 512, (512,), device=device)) for _ in range(10)
]

for _epoch in range(3):
    for batch_idx, batch in enumerate(train_batches):
        loss = lit.training_step(batch, batch_idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
    lit.on_train_epoch_end()
