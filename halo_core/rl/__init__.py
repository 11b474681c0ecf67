"""Reinforcement-learning pieces shared by the GRPO family: rollout engines, rewards, routing replay, advantages, losses."""
