"""Rewards for reinforcement fine-tuning: they score token ids."""
