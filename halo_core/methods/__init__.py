"""The training methods: each a stock TRL/transformers trainer with ``DistributedTrainerMixin`` ahead of it."""
