"""Lesson 15's exercise: the training function a colleague sent, as sent.

"It trains, but 3 ranks are no faster than 1, and the checkpoint won't load into the
evaluation model." Its pitfalls are for the learner to find; lesson 15's check measures them.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

BATCH = 4  # samples per micro-batch
K = 4  # micro-batches per optimizer step


def colleague_train(model, optimizer, dataset, checkpoint_path):
    """One epoch with gradient accumulation over K micro-batches; rank 0 saves the weights."""
    loader = DataLoader(dataset, batch_size=BATCH)
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), checkpoint_path)
