"""C9: from what model size sharding (FSDP2) pays against DDP: the largest batch per variant and the throughput there."""
