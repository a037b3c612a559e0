"""Learners: online estimates made while serving (each server's pace, the costs probed at load, co-activation)."""
