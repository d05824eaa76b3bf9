"""A small Lightning fit (sanity validation first, then training): the boundary is the optimizer step."""

import lightning as L
import torch


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


ds = torch.utils.data.TensorDataset(torch.randn(2048, 64), torch.randn(2048, 1))
dl = torch.utils.data.DataLoader(ds, batch_size=32)
trainer = L.Trainer(
    max_epochs=1,
    accelerator="gpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(M(), dl, dl)
print("fit done")
