"""C2, device_ids must match the model's device: the probe and its text (the probe's verdict stands)."""
