"""Scaffolds and example configs; installed as ``halo_cli.templates`` so `halo new-family` finds them in any install."""
