"""Small facts about the host, without torch: NVML's view of the GPUs, the GPU lock files, the
project's source as git knows it."""
