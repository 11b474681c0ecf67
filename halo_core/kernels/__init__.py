"""GPU kernels Halo plugs into the ecosystem's own registries (optional: each needs its GPU extra)."""
