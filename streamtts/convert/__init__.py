"""Offline tooling: checkpoints to the published GGUF bundle, the fused-heads file, downloads."""
