"""A model written from scratch (weight tensors, no nn.Module) evaluated over a DataLoader without
torch.no_grad(), keeping every batch's predictions with their graphs.

Expected: leak, one step = one DataLoader batch, born at the prediction, held by `all_preds`.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
w1 = (torch.randn(512, 512, device=device) / 512**0.5).requires_grad_()
b1 = torch.zeros(512, device=device, requires_grad=True)
w2 = (torch.randn(512, 512, device=device) / 512**0.5).requires_grad_()
b2 = torch.zeros(512, device=device, requires_grad=True)

dataset = TensorDataset(torch.randn(30 * 512, 512), torch.randint(0, 512, (30 * 512,)))
loader = DataLoader(dataset, batch_size=512)

all_preds, correct = [], 0
for xb, yb in loader:
    xb, yb = xb.to(device), yb.to(device)
    preds = torch.relu(xb @ w1 + b1) @ w2 + b2  # SITE
    all_preds.append(preds)
    correct += (preds.argmax(-1) == yb).sum().item()
print(f"accuracy {correct / len(dataset):.4f}")
