"""The training workload: a small GPT, offline text, and the multi-DC strategies on torch.distributed."""
