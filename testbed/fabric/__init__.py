"""Bringing a plan to life: one interface (`Fabric`), several backends (netns today)."""
