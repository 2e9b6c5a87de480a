"""mlaunch: one command for multi-node, multi-GPU fine-tuning."""
__version__ = "0.1.0"
