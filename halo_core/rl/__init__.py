"""Reinforcement-learning pieces shared by the GRPO family: routing replay, importance sampling."""
