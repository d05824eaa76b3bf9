"""A newcomer's HF Trainer fine-tune with a custom compute_loss that keeps the logits for later analysis."""
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, num_labels=2)
model = BertForSequenceClassification(cfg)


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 2048

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 1000, (64,), generator=g), "labels": torch.tensor(i % 2)}


class MyTrainer(Trainer):
    kept_logits = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        self.kept_logits.append(outputs.logits.detach().argmax(-1).cpu())
        return (outputs.loss, outputs) if return_outputs else outputs.loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=16, num_train_epochs=1, max_steps=300,
                         logging_steps=20, save_strategy="no", report_to=[], disable_tqdm=True)
MyTrainer(model=model, args=args, train_dataset=DS()).train()
print("kept", len(MyTrainer.kept_logits))
