"""Accuracy checks: every backend against the PyTorch reference, per the policy of docs/DESIGN.md section 4."""
