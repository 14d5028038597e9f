"""Accuracy checks: every backend against the PyTorch reference, per the policy of DESIGN.md section 4."""
