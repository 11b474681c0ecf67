"""Training methods: stock TRL/transformers trainers with ``DistributedTrainerMixin`` mixed in ahead of them."""
