"""Training: the trainer loop, train and eval steps, optimizer, checkpoints, metrics, multi-process set-up."""
