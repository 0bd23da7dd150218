"""Bringing a plan to life: one interface (base.Fabric), the lifecycle written once against every backend
(lifecycle.py), the state file (state.py), and one package per backend (netns/, docker/, ssh/), each a name in
registry.py."""
