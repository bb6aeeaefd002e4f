"""Case code for lesson 15: scripts as colleagues send them, pitfalls included."""
