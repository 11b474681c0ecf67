"""The small parts ``DistributedTrainerMixin`` is composed of; each is usable and testable alone."""
