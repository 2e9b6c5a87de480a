"""A stand-in for LLaMA-Factory (tests only): see launcher.py."""
